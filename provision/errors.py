"""Expected errors and the exit code each family maps to.

Every error a user can cause or meet in normal operation is a `LockctlError`. The CLI's one
error boundary prints its message on one line and exits with its `exit_code`; anything else is a
bug and keeps its traceback.

    LockctlError                 1  (base; not raised directly)
    +-- InputError               2  bad flag, spec, config or template
    +-- LocalEnvironmentError    6  missing binary, unusable state folder, failed install
    +-- Interrupted            130  a stop signal (SIGTERM, SIGINT, SIGHUP) ended the command
    +-- ConsulError              (provision.consul.errors: 3 unavailable, 4 denied, 5 API error)
    +-- DatacentersFailed        (provision.cli.datacenters: 7 done in some datacenters and
                                  failed in others; failed in all: the first failure's code)

Messages never contain a token secret: the types that carry secrets mask themselves.
"""

from __future__ import annotations

EXIT_OK = 0
EXIT_FAILED = 1  # a check ran and found a difference or a failure (render --check, verify)
EXIT_INPUT = 2  # bad input: usage, spec, config, template
EXIT_UNAVAILABLE = 3  # Consul could not be reached, or did not answer within the client timeout
EXIT_DENIED = 4  # Consul refused: 403 permission denied
EXIT_CONSUL_API = 5  # any other error answer from Consul
EXIT_ENVIRONMENT = 6  # the local machine is not as needed (binary, state folder, processes)
EXIT_PARTIAL = 7  # an operator's command was done in some datacenters and failed in others
EXIT_INTERRUPTED = 130


class LockctlError(Exception):
    """Base of every expected error; `exit_code` says which family it is."""

    exit_code = EXIT_FAILED


class InputError(LockctlError):
    """The user's input (flag, file, config) is invalid."""

    exit_code = EXIT_INPUT


class LocalEnvironmentError(LockctlError):
    """Something on this machine is missing or in the way (binary, state folder, a process)."""

    exit_code = EXIT_ENVIRONMENT


class Interrupted(LockctlError):
    """A stop signal ended the command at a safe point (what was held is released)."""

    exit_code = EXIT_INTERRUPTED


# `lockctl run` only; a child's own exit status passes through unchanged.
EXIT_WAIT_TIMEOUT = 75  # --wait --timeout ran out before the lock was free (EX_TEMPFAIL)
EXIT_LOCK_LOST = 76  # the lock was lost while the job ran; the job was stopped (fenced)
EXIT_JOB_TIMEOUT = 124  # the job ran past its `timeout` and was stopped (as coreutils timeout)
# `lockctl abort` stopped the run: an operator's stop, the status a SIGTERM to the runner gives
EXIT_ABORTED = 128 + 15
