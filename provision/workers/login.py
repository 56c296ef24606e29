"""A worker's login (its config's `consul.login`), for `lockctl run` and `lockctl schedule`:
log in before the first call, keep logging in again on a thread, log out at the end
(consul/login.py does the work; docs/identity.md says what each command does)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from provision.consul import Consul, ConsulUnavailable
from provision.consul.login import Login, LoginConfig, retry_delay
from provision.workers.config import WorkerConfig


def open_login(
    consul: Consul,
    config: WorkerConfig,
    emit: Callable[..., Any],
    *,
    wait: Callable[[float], bool] | None = None,
) -> Login | None:
    """Log `consul` (and every client sharing its token source) in as the config's worker and
    keep it logged in; None when the config names a token file instead.

    A refusal (LoginRefused, exit 4) or an unreadable bearer-token file (InputError, exit 2)
    is raised at once. Consul unavailable is raised too, unless `wait` is given (a scheduler:
    it sleeps that long and says whether a stop was requested meanwhile): then the login is
    tried again until it works, or the stop's request ends the wait (None: no login was made,
    and the caller stops)."""
    if config.login is None:
        return None
    login = Login(
        consul.identity,
        consul.transport.tokens,
        LoginConfig(config.login.auth_method, config.login.bearer_token_file),
        emit=emit,
    )
    failures = 0
    while True:
        try:
            login.login()
            break
        except ConsulUnavailable as exc:
            if wait is None:
                raise
            failures += 1
            pause = retry_delay(failures, None)
            emit("login-failed", error=str(exc), retry_in_ms=round(pause * 1000))
            if wait(pause):
                return None
    login.start()
    return login
