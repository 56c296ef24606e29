"""What a job run under the lock is given of the runner's environment: the runner's own, less
lockctl's Consul credentials (`job_environment`), and the worker's secret files its mount
namespace covers (`credential_files`)."""

from __future__ import annotations

import os
from collections.abc import Mapping

from provision.consul import ConsulSettings

# lockctl's own credentials, and where they are: the job must not act as the worker.
RUNNER_ONLY = (
    "CONSUL_HTTP_TOKEN",
    "CONSUL_HTTP_TOKEN_FILE",
    "CONSUL_CLIENT_CERT",
    "CONSUL_CLIENT_KEY",
    "LOCKCTL_CONFIG",  # names the token file and the TLS pair
    "LOCKCTL_BEARER_TOKEN_FILE",  # the JWT a worker logs in with (lockctl.env)
)


def job_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """The job's environment: the runner's, less lockctl's own Consul credentials."""
    return {key: value for key, value in environ.items() if key not in RUNNER_ONLY}


def credential_files(settings: ConsulSettings) -> tuple[str, ...]:
    """The worker's own secrets on this host (its token file, its TLS client pair), which the
    job's mount namespace covers: the job cannot read them, though it runs as the same user.
    A worker that logs in has its bearer-token file (its JWT) covered the same way."""
    files = (
        settings.token_file,
        settings.client_key,
        settings.client_cert,
        settings.bearer_token_file,
    )
    return tuple(os.path.abspath(path) for path in files if path is not None)
