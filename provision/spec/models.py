"""The validated spec: what the rest of lockctl consumes, never the raw HCL."""

from __future__ import annotations

from dataclasses import dataclass

from provision.blackouts import Blackout
from provision.durations import Duration, parse_duration
from provision.spec.names import DEFAULT_OWNER, lock_key
from provision.system.http_call import HttpCall
from provision.system.notify_rules import NO_NOTIFICATIONS, Notifications
from provision.timings import (
    COUNT_DEFAULTS,
    DEFAULT_CATCHUP,
    DEFAULT_CATCHUP_REACH,
    DEFAULT_OVERLAP,
    DEFAULTS,
    CatchupReach,
    JobTimings,
)

DEFAULT_ADDRESS = "http://127.0.0.1:8500"
DEFAULT_START_DEADLINE = parse_duration(DEFAULTS["start_deadline"])
DEFAULT_HISTORY_LIMIT = COUNT_DEFAULTS["history_limit"]
NO_JITTER = parse_duration(DEFAULTS["jitter"])
DEFAULT_RETRY_DELAY = parse_duration(DEFAULTS["retry_delay"])


@dataclass(frozen=True)
class Defaults:
    """Settings a job inherits unless it sets its own (renew_interval None means TTL/3)."""

    ttl: Duration
    lock_delay: Duration
    renew_interval: Duration | None
    kill_grace: Duration
    min_hold: Duration | None
    start_deadline: Duration = DEFAULT_START_DEADLINE
    history_limit: int = DEFAULT_HISTORY_LIMIT
    jitter: Duration = NO_JITTER
    timeout: Duration | None = None  # None: a run may go on as long as it likes
    catchup: str = DEFAULT_CATCHUP  # "skip", "latest" or "all" (ledger/catchup.py)
    catchup_reach: CatchupReach = DEFAULT_CATCHUP_REACH  # catchup_window, catchup_limit
    overlap: str = DEFAULT_OVERLAP  # "skip", "buffer_one" or "cancel" (tick/overlap.py)
    retries: int = 0  # attempts after a failed first one (tick/retries.py)
    retry_delay: Duration = DEFAULT_RETRY_DELAY
    retry_on_timeout: bool = False
    notifications: Notifications = NO_NOTIFICATIONS  # notify blocks and ping_url_file
    blackouts: tuple[Blackout, ...] = ()  # every job's blackout windows (provision/blackouts.py)


@dataclass(frozen=True)
class AuthMethod:
    """A Consul `jwt` auth method the spec declares (Consul's own field names, snake_cased).

    `claim_mappings` pairs (selector name, claim), sorted by name: Consul's ClaimMappings map
    is {claim: name}; the spec writes it the other way round, as a claim is no HCL identifier.
    The public keys are read from `jwt_validation_pub_keys_file` when rendering, not here.
    """

    name: str
    type: str
    bound_issuer: str | None
    bound_audiences: tuple[str, ...]
    jwt_validation_pub_keys_file: str
    max_token_ttl: Duration
    claim_mappings: tuple[tuple[str, str], ...]
    line: int
    keys_line: int  # the line of jwt_validation_pub_keys_file, for errors reading it


@dataclass(frozen=True)
class Identity:
    """Who may log in as a worker: the claims (selector name, value), sorted, a JWT from
    `auth_method` must carry; a binding rule's selector is built from them."""

    auth_method: str
    claims: tuple[tuple[str, str], ...]
    line: int


@dataclass(frozen=True)
class Worker:
    """A Consul node a job may run on, and the HTTP address of its agent (of a server, when
    it has no agent of its own)."""

    name: str
    address: str
    line: int
    identity: Identity | None = None  # set: the worker may log in through an auth method
    # no local agent (a pod): `address` is a Consul server's; the worker is registered as a
    # catalog node of its own name and its sessions are TTL-only (docs/identity.md)
    agentless: bool = False
    datacenter: str | None = None  # the Consul datacenter it is in; None: the only one
    # the most runs its `lockctl schedule` has at once (tick/capacity.py); None: no cap
    max_concurrent_runs: int | None = None


@dataclass(frozen=True)
class Job:
    """One singleton job: its lock prefix, the workers that may run it, its timings (the very
    JobTimings its workers' configs carry), and its tick ledger's settings."""

    name: str
    prefix: str
    workers: tuple[str, ...]
    timings: JobTimings
    schedule: str | None
    command: tuple[str, ...] | None
    line: int
    timezone: str = "UTC"  # the IANA zone `schedule` is read in
    history_limit: int = DEFAULT_HISTORY_LIMIT  # tick records kept per job
    http: HttpCall | None = None  # an HTTP job's call, instead of `command` (spec/http_block.py)
    catchup: str = DEFAULT_CATCHUP  # after a time nobody ran it: "skip", the "latest", or "all"
    catchup_reach: CatchupReach = DEFAULT_CATCHUP_REACH  # how far back "all" goes
    overlap: str = DEFAULT_OVERLAP  # a tick that comes while it runs (tick/overlap.py)
    # an HTTP job may call a link-local or metadata target, and lint says nothing of a remote one
    allow_remote_target: bool = False
    http_url_line: int | None = None  # where `http.url` is: lint's findings of the target
    notifications: Notifications = NO_NOTIFICATIONS  # its own over those of `defaults`
    # "datacenter": once per tick in each datacenter its workers are in (docs/datacenters.md);
    # None: its workers are in one datacenter
    scope: str | None = None
    # the windows its ticks are not run in: those of `defaults`, then its own
    blackouts: tuple[Blackout, ...] = ()
    # a keyed job's keys `lockctl schedule` runs, each once per tick (provision/keyed.py)
    keys: tuple[str, ...] = ()

    @property
    def lock_key(self) -> str:
        """The key this job's lock lives at."""
        return lock_key(self.prefix)


@dataclass(frozen=True)
class Spec:
    """A whole validated spec file; jobs and workers sorted by name."""

    path: str
    defaults: Defaults
    workers: tuple[Worker, ...]
    jobs: tuple[Job, ...]
    auth_methods: tuple[AuthMethod, ...] = ()  # sorted by name
    owner: str = DEFAULT_OWNER  # whose Consul objects these are: plan and apply touch no other's

    def worker(self, name: str) -> Worker:
        """The worker called `name` (KeyError if it is not declared)."""
        for worker in self.workers:
            if worker.name == name:
                return worker
        raise KeyError(name)

    def jobs_for(self, worker: str) -> tuple[Job, ...]:
        """The jobs `worker` may run."""
        return tuple(job for job in self.jobs if worker in job.workers)
