"""The TickStore over Consul: today's code (provision/consul's client, the Ledger, the sessions
helpers, the operators' reads), each method a thin call into it. Only provision/consul speaks
HTTP; this module translates the refusals the protocol names (store.py) and nothing else."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime

from provision.consul import NO_RETRY, Consul, ConsulHTTPError, KVOp, NotFound
from provision.ledger.control import NOTE_MAX_BYTES, decode_note
from provision.ledger.operator import read_pauses
from provision.ledger.records import TickRecord
from provision.ledger.store import Claim, Completion, Ledger
from provision.sessions import SessionTerms, create_session
from provision.system.control_keys import trigger_key
from provision.tick.store import (
    MAX_WATCH,
    PLAIN,
    ClaimTerms,
    ControlState,
    JobKeys,
    SessionGone,
    ValueTooLarge,
    check_terms,
    records_under,
    refuse_invalid_session,
)

TOO_LARGE = 413  # Consul's answer to a request body or value over its caps


@contextmanager
def _sized() -> Iterator[None]:
    """A 413 is the protocol's ValueTooLarge (Consul applied nothing)."""
    try:
        yield
    except ConsulHTTPError as exc:
        if exc.status != TOO_LARGE:
            raise
        raise ValueTooLarge(str(exc)) from exc


class ConsulTickStore:
    """A TickStore on a Consul client (its token, retries and agent clock as it was made)."""

    def __init__(self, consul: Consul) -> None:
        self.consul = consul

    def _ledger(self, job: JobKeys) -> Ledger:
        return Ledger(self.consul, job.lock_key, job.control)

    # -- sessions ------------------------------------------------------------------------------
    def create_session(self, terms: SessionTerms) -> str:
        check_terms(terms)
        return create_session(self.consul, terms)

    def renew_session(self, session_id: str, *, timeout: float | None = None) -> None:
        # once, not retried: the next interval is the retry (provision/sessions.py)
        try:
            self.consul.session.renew(session_id, timeout=timeout, retry=NO_RETRY)
        except NotFound as exc:
            raise SessionGone(f"session {session_id}: gone (renew: 404)") from exc

    def destroy_session(self, session_id: str) -> None:
        self.consul.session.destroy(session_id)

    # -- a tick --------------------------------------------------------------------------------
    def claim(
        self,
        job: JobKeys,
        record: TickRecord,
        session_id: str,
        holder: bytes,
        terms: ClaimTerms = PLAIN,
    ) -> Claim:
        with _sized():
            claim = self._ledger(job).claim(record, holder, session_id, terms)
        return refuse_invalid_session(job, claim)

    def complete(
        self, job: JobKeys, record: TickRecord, session_id: str, *, release: bool
    ) -> Completion:
        return self._ledger(job).complete(record, session_id, release=release)

    # -- the ledger ----------------------------------------------------------------------------
    def read_tick(
        self, job: JobKeys, tick: datetime, *, stale: bool = False
    ) -> tuple[TickRecord | None, datetime | None]:
        return self._ledger(job).read(tick, stale=stale)

    def read_ticks(self, job: JobKeys, *, stale: bool = False) -> list[TickRecord]:
        if not stale:
            return self._ledger(job).records()
        # the KV tree read has no stale mode in the client; a read-only transaction has (?stale)
        answer = self.consul.txn.read([KVOp("get-tree", job.ticks)])
        return records_under(job.ticks, ((e.key, e.value, e.modify_index) for e in answer.results))

    def read_tick_names(self, job: JobKeys) -> tuple[set[datetime], datetime | None]:
        return self._ledger(job).tick_names()

    def record_unrun(self, job: JobKeys, records: Sequence[TickRecord]) -> list[TickRecord]:
        with _sized():
            return self._ledger(job).record_unrun(records)

    def prune(self, job: JobKeys, ticks: Iterable[datetime]) -> int:
        return self._ledger(job).prune(ticks)

    # -- operators and the lock ----------------------------------------------------------------
    def read_control(self, job: JobKeys) -> ControlState:
        pauses = read_pauses(self.consul, job.name)
        trigger, _ = self.consul.kv.get(
            trigger_key(job.name), consistency="consistent", max_bytes=NOTE_MAX_BYTES * 2
        )
        taken, _ = self.consul.kv.get(job.taken, consistency="consistent")
        return ControlState(
            pauses,
            None if trigger is None else decode_note(trigger.value),
            None if taken is None else taken.value or b"",
            0 if taken is None else taken.modify_index,
        )

    def watch_lock(self, job: JobKeys, index: int, wait: float) -> tuple[str | None, int]:
        entry, meta = self.consul.kv.get(
            job.lock_key, consistency="consistent", index=index, wait=min(wait, MAX_WATCH)
        )
        seen = meta.index or 0
        # Consul's advice: an index that goes backwards (a snapshot restore) starts over at 0
        return (None if entry is None else entry.session), (seen if seen >= index else 0)
