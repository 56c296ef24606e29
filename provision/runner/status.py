"""`lockctl status`: who holds each job's lock, from consistent reads (never ?stale).

What Consul vouches for (the key's session and that session's node) is kept apart from what the
holder claims (the record it wrote into the key's value, which anyone with write on the key can
write). Every string here that came from Consul is already printable and bounded
(provision/system/text.py); the CLI still prints them as plain text, never as markup.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Any

from provision.consul import Consul, ConsulError
from provision.keyed import keys_folder, keys_in
from provision.ledger.backfilling import readable_pending_backfill
from provision.ledger.history import Wanted, ledger_job, read_history
from provision.ledger.holder import CLAIM_LIMIT, claimed_worker, holder_record
from provision.ledger.operator import readable_pause_state, readable_pending_trigger
from provision.ledger.records import tick_name
from provision.spec import Job, Spec
from provision.spec.datacenters import check_datacenter_flag, chosen_datacenters, job_datacenters
from provision.system.text import printable

KEYS_SHOWN = 10  # a keyed job's keys named by status; the rest counted
KEYS_READ_BYTES = 4 * 1024 * 1024  # the listing of its keys' folders, at most


@dataclass(frozen=True)
class LastTick:
    """The newest tick of a job's ledger: a record, or a tick nobody ran (missed)."""

    tick: str  # UTC, as the ledger names it
    outcome: str  # as `lockctl history` shows it: `abandoned`, `missed (not recorded yet)`, ...
    worker: str | None  # the record's own word


@dataclass(frozen=True)
class LockState:
    job: str
    key: str
    held: bool
    session: str | None = None  # Consul's word: the session on the key
    node: str | None = None  # Consul's word: the node the holding session lives on
    claims: dict[str, str] = field(default_factory=dict)  # the holder's record, as written
    claim_matches_node: bool | None = None  # None: no claimed worker, or the node is unknown
    lock_index: int | None = None
    modify_index: int | None = None
    last_tick: LastTick | None = None  # jobs with a schedule: the newest tick of the ledger
    next_tick: str | None = None  # jobs with a schedule: when it runs next (UTC)
    suspect_ticks: int = 0  # records dated in the future: never the last tick (ledger/ticks.py)
    paused: str | None = None  # `by alice at ...: why` while an operator paused the job
    trigger_pending: str | None = None  # `by alice at ...: why`: a trigger no replica took yet
    backfill_pending: str | None = None  # `2 of 3 ticks left, asked by alice ...`: a backfill's
    datacenter: str | None = None  # the datacenter read, in a spec that names datacenters
    keys_seen: tuple[str, ...] = ()  # a keyed job's keys that have a lock or a ledger, a few
    keys_seen_count: int = 0  # all of them

    @property
    def forged(self) -> bool:
        """The record names another worker than the node Consul says the session is on."""
        return self.claim_matches_node is False

    def to_record(self) -> dict[str, Any]:
        """One lock's entry in `lockctl status --json`: every field, under its own name
        (`datacenter` only in a spec that names datacenters, `keys_seen` only for a job run with
        keys)."""
        record = asdict(self)
        if self.datacenter is None:
            del record["datacenter"]
        if not self.keys_seen_count:  # a job never run with a key: the record as it was
            del record["keys_seen"], record["keys_seen_count"]
        return record


def lock_targets(spec: Spec, only: str | None = None) -> list[tuple[Job, str | None]]:
    """Each job with each datacenter its workers are in (None: the agent's own, in a spec
    that names none), or only `only` (the jobs with no worker there left out)."""
    check_datacenter_flag(spec.workers, only)
    return [
        (job, datacenter)
        for job in spec.jobs
        if only is None or only in job_datacenters(spec.workers, job)
        for datacenter in chosen_datacenters(spec.workers, job, only)
    ]


def lock_state(consul: Consul, job: Job, datacenter: str | None) -> LockState:
    """One consistent read of the job's lock key, plus the holding session's node and, for a
    job with a schedule, one read of its ledger; `consul` asks `datacenter`."""
    state = replace(_state(consul, job.name, job.lock_key), datacenter=datacenter)
    return _with_keys(consul, _with_control(consul, _with_ticks(consul, job, state)))


def _with_keys(consul: Consul, state: LockState) -> LockState:
    """The keys runs of the job were keyed with (`lockctl run --key`): the folders under its
    `keys/`, one read of their names (a token that may not list them: none said)."""
    folder = keys_folder(state.key)
    try:
        names, _ = consul.kv.key_names(folder, separator="/", max_bytes=KEYS_READ_BYTES)
    except ConsulError:
        return state
    found = keys_in(names, folder)
    return replace(state, keys_seen=tuple(found[:KEYS_SHOWN]), keys_seen_count=len(found))


def _with_control(consul: Consul, state: LockState) -> LockState:
    """Who paused the job, when and why; the same of a trigger no replica has taken yet (a
    token that may not read the job's control keys: neither is said)."""
    pause = readable_pause_state(consul, state.job)
    if pause is not None and pause.note is not None:
        state = replace(state, paused=pause.said())
    pending = readable_pending_trigger(consul, state.job, state.key)
    if pending is not None:
        state = replace(state, trigger_pending=pending.said())
    backfill = readable_pending_backfill(consul, state.job, state.key)
    if backfill is not None:
        state = replace(state, backfill_pending=backfill.said())
    return state


def _with_ticks(consul: Consul, job: Job, state: LockState) -> LockState:
    ledger = ledger_job(job)
    if ledger is None:
        return state
    history = read_history(consul, ledger, wanted=Wanted(1))  # the newest record is the last tick
    row = history.last  # never a suspect record: a tick of 2099 is not the last run
    worker = None if row is None or row.record is None else row.record.worker
    # a paused tick in a word: who paused it, when and why is the `paused` column's
    label = None if row is None else "paused" if row.outcome == "paused" else row.label
    last = None if row is None or label is None else LastTick(tick_name(row.tick), label, worker)
    return replace(
        state,
        last_tick=last,
        next_tick=tick_name(history.next_tick),
        suspect_ticks=history.suspect_count,
    )


def _state(consul: Consul, job: str, key: str) -> LockState:
    entry, _ = consul.kv.get(key, consistency="consistent")
    if entry is None or entry.session is None:
        lock_index = entry.lock_index if entry else None
        return LockState(job, key, False, lock_index=lock_index)
    node = _node_of(consul, entry.session)
    claims = holder_record(entry.value)
    return LockState(
        job,
        key,
        True,
        session=printable(entry.session, CLAIM_LIMIT),
        node=None if node is None else printable(node, CLAIM_LIMIT),
        claims=claims,
        claim_matches_node=_matches(claimed_worker(entry.value), node),
        lock_index=entry.lock_index,
        modify_index=entry.modify_index,
    )


def _node_of(consul: Consul, session_id: str) -> str | None:
    try:
        session = consul.session.info(session_id, consistency="consistent")
    except ConsulError:
        return None  # a token with key read but no session read still sees the key
    return session.node if session else None


def _matches(claimed: str | None, node: str | None) -> bool | None:
    """Compared raw, before escaping: escaped text could look like a plain name."""
    if claimed is None or node is None:
        return None
    return claimed == node
