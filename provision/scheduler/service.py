"""What `lockctl schedule` settles before its tick core starts (scheduler/on_core.py): which
jobs it runs, how it reaches Consul (every file that names read and checked), and that it is
the only scheduler of its config on this host (the config file is locked while it runs).

Each replica (a VM, a container, a pod) runs one `lockctl schedule`. The process's owner (the
CLI) turns signals into calls:

    SIGTERM, SIGINT  stop: no new claim; a running job gets the signal and its kill grace, its
                     record is completed, the lock released, every session destroyed; exit 0
    SIGHUP           reload the worker config, checked whole (its files too) before anything
                     changes: a bad one is refused and the old one kept; a good one changes only
                     the jobs it changed, each as its own run ends (scheduler/reload.py)
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

from provision.consul import (
    ConsulSettings,
    check_tls_files,
    resolve_settings,
)
from provision.consul.login import read_bearer_token
from provision.errors import InputError, LocalEnvironmentError
from provision.workers.config import JobConfig, WorkerConfig

JOIN_POLL = 0.5
# Connections kept to the agent, and calls at once (watches of running jobs aside): hundreds of
# jobs ticking at :00 queue for a turn instead of opening a connection each.
POOL_SIZE, IN_FLIGHT = 64, 32
CLOCK_PROBE_TIMEOUT = 2.0  # seconds for the first answer at start, for the agent's clock


def scheduled_jobs(config: WorkerConfig) -> list[JobConfig]:
    """What this scheduler runs: the jobs with a schedule and a command (or an http call), a
    keyed job as each of its keys (JobConfig.units: told apart by `unit`)."""
    runnable = [
        job for job in config.jobs if job.schedule is not None and (job.command or job.http)
    ]
    return [unit for job in runnable for unit in job.units()]


def checked_connection(config: WorkerConfig) -> ConsulSettings:
    """How `config` reaches Consul, with every file it names read and checked (the token file
    holds a token; the CA, the client certificate and its key are readable and load): what
    the start fails on, and what a reload must know works before it changes anything."""
    if not scheduled_jobs(config):
        raise InputError(
            f"{config.path}: no job with a schedule and a command for {config.worker}: "
            "nothing to schedule"
        )
    settings = resolve_settings(**config.connection())
    check_tls_files(settings)
    if config.login is not None:  # the JWT is there now (it is read again for each login)
        read_bearer_token(config.login.bearer_token_file)
    return settings


@contextlib.contextmanager
def single_instance(config_path: Path) -> Iterator[int]:
    """Hold an exclusive lock on the config file while the scheduler runs; a second
    `lockctl schedule` of the same config on this host is refused (exit 6)."""
    fd = os.open(config_path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise LocalEnvironmentError(
                f"{config_path}: another `lockctl schedule` runs with this config on this host"
            ) from None
        yield fd
    finally:
        os.close(fd)


def connection_key(settings: ConsulSettings) -> ConsulSettings:
    """What makes two connections the same for a reload: everything but the token's value (a
    token re-read from the same file goes to the same client: Consul.use_token)."""
    return dataclasses.replace(settings, token=None)
