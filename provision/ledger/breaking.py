"""`lockctl break JOB`: destroy the session that holds a job's lock when its replica is gone.

What break knows is read first (`read_holder`), judged without I/O (`break_refusal`), shown to
the operator, and only then acted on (`destroy_holder`), which reads again and destroys only the
session that was shown. Consul's word (the key's session, the session's node, that node's
serfHealth) is kept apart from the holder's (the record it wrote into the key, its tick's
ledger record): anyone who may write the job's prefix writes the latter.

Why the node's health decides: a renewal leaves no trace in Consul 1.8.7 (no "last renewed"),
so whether the replica is alive cannot be read; its node's serfHealth can. A session with the
serfHealth check ends by itself once that check is critical, so break without `--force` is for
the window before that; a replica dead on a healthy node (kill -9, a hung host process) keeps
its session until its TTL ends, which needs `--force` and the operator's word that it is gone.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone

from provision.consul import AnswerTooLarge, Consul
from provision.consul.models import Session
from provision.errors import EXIT_DENIED, LockctlError
from provision.ledger.holder import CLAIM_LIMIT, RECORD_FIELDS, holder_record
from provision.ledger.records import (
    RECORD_MAX_BYTES,
    TickRecord,
    decode,
    parse_tick_name,
    ticks_prefix,
)
from provision.system.text import printable

SERF_HEALTH = "serfHealth"
LOCKCTL_SESSION = "lockctl "  # every session lockctl makes is named so (runner, scheduler, embed)


@dataclass(frozen=True)
class Refusal:
    """Why break destroys nothing: `nothing_held` (the lock is free: exit 0), else refused
    (exit 1) and --force would allow it."""

    reason: str
    nothing_held: bool = False
    advice: str = ""  # what would allow it

    def said(self) -> str:
        return f"{self.reason}; {self.advice}" if self.advice else self.reason


class BreakDenied(LockctlError):
    """This token may not read the holder's session: exit 4, as Consul's 403."""

    exit_code = EXIT_DENIED


class BreakRefused(LockctlError):
    """`lockctl break` refused, or not confirmed, or the holder changed meanwhile: nothing was
    destroyed (exit 1)."""


@dataclass(frozen=True)
class HolderView:
    """What break knows of a job's lock: all text printable and bounded, except `session_id`
    (Consul's raw ID, kept to destroy exactly that session)."""

    job: str
    key: str
    session_id: str | None  # the key's session (None: the lock is free)
    lock_index: int | None
    session: Session | None = None  # Consul's session info (None: it ended meanwhile)
    serf_health: str | None = None  # the node's serfHealth status; None: no such check known
    claims: dict[str, str] = field(default_factory=dict)  # the holder's record, as written
    tick_record: TickRecord | None = None  # the ledger's record of the tick it claims to run
    also_holds: tuple[str, ...] = ()  # the spec's other jobs whose locks the session holds

    @property
    def lockctls(self) -> bool:
        """The session is lockctl's by its name (what a holder that is not lockctl's, e.g.
        `consul lock`, never is); the record is the holder's word and says nothing here."""
        return self.session is not None and self.session.name.startswith(LOCKCTL_SESSION)

    @property
    def shown_id(self) -> str:
        return printable(self.session_id or "", CLAIM_LIMIT)

    @property
    def node(self) -> str:
        return "" if self.session is None else printable(self.session.node, CLAIM_LIMIT)

    @property
    def lock_delay(self) -> float:
        return 0.0 if self.session is None else self.session.lock_delay_ns / 1e9

    @property
    def forged(self) -> bool:
        """The record names another worker than the node Consul says the session is on."""
        claimed = self.claims.get("worker")
        return self.session is not None and claimed is not None and claimed != self.node


def read_holder(consul: Consul, job: str, lock_key: str, others: dict[str, str]) -> HolderView:
    """The job's lock and who holds it, from consistent reads: the key, its session, the
    session's node's checks, the tick record the holder's record names; and which of `others`
    (the spec's other jobs: name -> lock key) the same session holds. A lock key is read whole,
    whatever its value (Consul caps it at 512 KB): a value planted to be too large must not keep
    the operator from breaking the lock it sits on."""
    entry, _ = consul.kv.get(lock_key, consistency="consistent")
    if entry is None or entry.session is None:
        return HolderView(job, lock_key, None, None if entry is None else entry.lock_index)
    view = HolderView(job, lock_key, entry.session, entry.lock_index)
    session = consul.session.info(entry.session, consistency="consistent")
    if session is None:
        _unless_hidden(consul, view)
        return view
    claims = holder_record(entry.value)
    checks = consul.health.node_checks(session.node, consistency="consistent")
    serf = [check.status for check in checks if check.check_id == SERF_HEALTH]
    return HolderView(
        job,
        lock_key,
        entry.session,
        entry.lock_index,
        session,
        printable(serf[0], CLAIM_LIMIT) if serf else None,
        claims,
        _tick_record(consul, lock_key, claims.get("tick")),
        _also_held(consul, entry.session, others),
    )


def _unless_hidden(consul: Consul, view: HolderView) -> None:
    """Consul answers a session this token may not read as it answers one that ended: empty.
    A key that still names the session after that consistent read tells them apart (an ended
    session leaves its keys in the same Raft entry)."""
    entry, _ = consul.kv.get(view.key, consistency="consistent")
    if entry is not None and entry.session == view.session_id:
        raise BreakDenied(
            f"the session holding {view.key} ({view.shown_id}) is not readable with this token "
            "(no session read on its node): break needs an operator's token"
        )


def _tick_record(consul: Consul, lock_key: str, tick: str | None) -> TickRecord | None:
    """The ledger's record of the tick the holder says it runs (a name that is no tick's:
    none read)."""
    moment = None if tick is None else parse_tick_name(tick)
    if tick is None or moment is None:
        return None
    try:
        entry, _ = consul.kv.get(
            ticks_prefix(lock_key) + tick, consistency="consistent", max_bytes=RECORD_MAX_BYTES * 2
        )
    except AnswerTooLarge:
        return None  # no record of lockctl's is that large: nothing it says is shown
    return None if entry is None else decode(moment, entry.value, entry.modify_index)


def _also_held(consul: Consul, session_id: str, others: dict[str, str]) -> tuple[str, ...]:
    """A scheduler's replica holds every job of the same TTL and LockDelay under one session:
    destroying it frees all their locks."""
    held = []
    for job, key in sorted(others.items()):
        entry, _ = consul.kv.get(key, consistency="consistent")
        if entry is not None and entry.session == session_id:
            held.append(job)
    return tuple(held)


def break_refusal(view: HolderView, force: bool) -> Refusal | None:
    """Why `lockctl break` does not destroy the holder's session, or None (pure). Free, or the
    session ended meanwhile: nothing to break (`needs_force` False). Without --force: a session
    that is not lockctl's; a node whose serfHealth is not critical (passing: the replica may be
    alive; unknown: a TTL-only session of an agentless worker, or a node this token may not
    read)."""
    if view.session_id is None:
        return Refusal(f"nothing to break: the lock of job {view.job} ({view.key}) is free", True)
    if view.session is None:
        return Refusal(
            f"nothing to break: the session that held {view.key} ended meanwhile (the lock is "
            "free, or in its lock-delay)",
            True,
        )
    if force:
        return None
    if not view.lockctls:
        name = printable(view.session.name, CLAIM_LIMIT)
        return Refusal(
            f'the session is not lockctl\'s (named "{name}")', advice="--force to destroy it"
        )
    if view.serf_health == "critical":
        return None
    if view.serf_health is None:
        return Refusal(
            f"node {view.node} has no serfHealth check this token can read (a TTL-only session "
            "of an agentless worker, or no node read): whether its replica is gone cannot be "
            "told",
            advice="make sure it is, then --force",
        )
    return Refusal(
        f"node {view.node} is healthy (serfHealth {view.serf_health}): its replica may be "
        "alive and renewing",
        advice="make sure it is gone, then --force",
    )


@dataclass(frozen=True)
class Broken:
    """What `destroy_holder` did: the session destroyed, and from when the lock may be taken
    again (the operator's clock plus the session's LockDelay; Consul counts it from its own
    invalidation, a moment later)."""

    session_id: str
    claimable_at: datetime
    lock_delay: float

    def said(self) -> str:
        claimable = self.claimable_at.isoformat(timespec="seconds").replace("+00:00", "Z")
        return (
            f"session {self.session_id} destroyed: the lock may be taken again from about "
            f"{claimable} (LockDelay {self.lock_delay:g}s)"
        )


def destroy_holder(consul: Consul, shown: HolderView, now: datetime | None = None) -> Broken:
    """Destroy the session `shown` holds the lock under, if it still does (a consistent read
    right before: a holder that changed while the operator confirmed is not the one they
    confirmed). PUT /v1/session/destroy/:id needs session write on the session's node."""
    assert shown.session_id is not None
    entry, _ = consul.kv.get(shown.key, consistency="consistent")
    if entry is None or entry.session != shown.session_id:
        raise BreakRefused(
            f"the lock {shown.key} changed while you confirmed (its holder is no longer session "
            f"{shown.shown_id}): nothing destroyed; run break again"
        )
    consul.session.destroy(shown.session_id)
    at = now or datetime.now(timezone.utc)
    return Broken(shown.shown_id, at + timedelta(seconds=shown.lock_delay), shown.lock_delay)


def describe(view: HolderView, now: datetime) -> list[str]:
    """What break shows before it asks (pure): Consul's word first, then the holder's."""
    assert view.session is not None and view.session_id is not None
    session = view.session
    lines = [
        f"lock:       {view.key} (job {view.job}), LockIndex {view.lock_index} (the fencing token)",
        f'session:    {view.shown_id} "{printable(session.name, CLAIM_LIMIT)}" (Consul\'s word)',
        f"node:       {view.node}, serfHealth {view.serf_health or 'unknown (no such check)'}",
        f"age:        made at Raft index {session.create_index}: Consul 1.8.7 keeps no time "
        "for a session (an index is no time)",
        f"ttl:        {printable(session.ttl, CLAIM_LIMIT) or 'none'}: a session nobody renews "
        "ends by itself within twice that, then its lock-delay",
        f"lock-delay: {view.lock_delay:g}s after the destroy, nobody may take the lock",
    ]
    lines += _holder_lines(view, now)
    if view.also_holds:
        lines.append(f"also holds: the locks of {', '.join(view.also_holds)} (freed too)")
    return lines


def _holder_lines(view: HolderView, now: datetime) -> list[str]:
    """The holder's record and its tick's ledger record: its own word, checked where Consul can
    check it (the worker against the node, the record's session against the key's)."""
    claims = view.claims
    if not claims:
        return ["record:     none lockctl wrote (the key's value is not a lockctl holder's)"]
    shown = ", ".join(f"{name} {claims[name]}" for name in RECORD_FIELDS if name in claims)
    lines = [f"record:     {shown} (the holder's word)"]
    if view.forged:
        lines.append(
            f"            it names worker {claims['worker']}, not node {view.node}: forged?"
        )
    taken = _parsed(claims.get("acquired_at"))
    if taken is not None:
        lines.append(f"held for:   {_span(now - taken)}, by the holder's clock")
    record = view.tick_record
    if record is not None:
        same = "its session" if record.session == view.session_id else "ANOTHER session"
        lines.append(
            f"tick:       {claims['tick']}: {record.outcome.value} in the ledger, claimed by "
            f"{record.worker} under {same}"
        )
    return lines


def _parsed(text: str | None) -> datetime | None:
    try:
        moment = datetime.fromisoformat(text or "")
    except ValueError:
        return None
    return moment if moment.tzinfo is not None else None


def _span(delta: timedelta) -> str:
    seconds = int(delta.total_seconds())
    if seconds < 0:
        return "a moment (its clock is ahead of this one)"
    hours, rest = divmod(seconds, 3600)
    return (
        f"{hours}h{rest // 60:02d}m{rest % 60:02d}s" if hours else f"{rest // 60}m{rest % 60:02d}s"
    )


def fencing_note(view: HolderView) -> str:
    """What protects the resource from a holder that is not gone after all."""
    return (
        f"if its replica still runs, it loses the lock: lockctl stops its job (exit 76) at its "
        f"next renewal or watch. Anything it still writes carries LockIndex {view.lock_index}: a "
        "resource that checks the fencing token refuses it once the next holder's (higher) has "
        "reached it"
    )
