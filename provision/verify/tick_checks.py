"""The tick check of `lockctl verify`: exactly once per tick, through the ledger's own claim.

Two sessions, on two workers, each with that worker's own token and agent, race for one tick
through `Ledger.claim` (the one transaction `lockctl run` claims with). Exactly one must win; the
loser must be refused because the tick is taken, and the record must name the winner. After the
winner completes the record and releases the lock, a claim of the same tick must still be
refused (the lock is free: only the record stands in the way), and a claim of the next tick
must succeed.

Nothing real is touched: the lock key and the ledger are the run's own, under
`<prefix>.lockctl-verify/tick-once-<run id>/` (covered by the job's ACL rule, next to no real
tick), and the ticks are minutes of 1970 chosen by the run id. Each key is registered for
cleanup before it is written, so the records go at the end whatever happens.
"""

from __future__ import annotations

import json
import os
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import datetime, timedelta, timezone

from provision.consul import Consul
from provision.ledger.records import TickRecord, tick_name
from provision.ledger.store import Claim, Ledger
from provision.outcomes import Outcome
from provision.verify.context import VerifyContext
from provision.verify.evidence import CheckFailed, CheckSkipped, Evidence, verify_session

LedgerFactory = Callable[[Consul, str], Ledger]  # the seam: what claims (tests break it here)
_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
_MINUTES_OF_1970 = 365 * 24 * 60 - 1  # leaves room for the next tick inside 1970
RACE_TIMEOUT = 30.0  # seconds a racing claim may take (the client's own timeout is shorter)


def scratch_tick(run_id: str) -> datetime:
    """The tick this verify run races for: a minute of 1970 chosen by its (hex) run id."""
    return _EPOCH + timedelta(minutes=int(run_id, 16) % _MINUTES_OF_1970)


@dataclass(frozen=True)
class Racer:
    worker: str
    ledger: Ledger
    session: str

    def claim(self, tick: datetime, run_id: str) -> Claim:
        record = TickRecord(
            tick,
            Outcome.RUNNING,
            worker=self.worker,
            session=self.session,
            host=socket.gethostname(),
            pid=os.getpid(),
            claimed_at=datetime.now(timezone.utc),
        )
        holder = {"worker": self.worker, "verify": run_id, "tick": tick_name(tick)}
        return self.ledger.claim(record, json.dumps(holder).encode(), self.session)

    def complete(self, tick: datetime, claim: Claim) -> bool:
        """Complete the record this racer's won claim wrote (succeeded) and release the lock."""
        record, _ = self.ledger.read(tick)
        if record is None:
            return False
        finished = record.completed(
            Outcome.SUCCEEDED,
            finished_at=datetime.now(timezone.utc),
            exit_status=0,
            duration=0.0,
            lock_index=claim.lock_index,
        )
        done = self.ledger.complete(
            replace(finished, modify_index=claim.record_index), self.session, release=True
        )
        return done.recorded and done.released is True


def check_tick_once(ctx: VerifyContext, ev: Evidence) -> str:
    return tick_once(ctx, ev, Ledger)


def tick_once(ctx: VerifyContext, ev: Evidence, ledger_for: LedgerFactory) -> str:
    """The check, with the ledger it claims through given (`Ledger` but in tests)."""
    a, b = _racers(ctx, ledger_for)
    tick = scratch_tick(ctx.run_id)
    following = tick + timedelta(minutes=1)
    for moment in (tick, following):  # registered before anything is written
        ctx.cleanup.key(ctx.client(a.worker), a.ledger.key(moment))
    name = tick_name(tick)

    claims = race(a, b, tick, ctx.run_id)
    ev.add(f"race for tick {name}: {_said(a, claims[0])}; {_said(b, claims[1])}")
    won = [(racer, claim) for racer, claim in zip((a, b), claims, strict=True) if claim.won]
    if len(won) != 1:
        raise CheckFailed(f"{len(won)} of two racing claims of tick {name} won, not exactly one")
    (winner, claim), loser = won[0], (b if won[0][0] is a else a)
    lost_claim = claims[1] if loser is b else claims[0]
    problems = _loser_told(loser, lost_claim, winner, tick, ev)

    if not winner.complete(tick, claim):
        raise CheckFailed(f"{winner.worker} could not complete tick {name} and release the lock")
    ev.add(f"{winner.worker} completed tick {name} (succeeded) and released the lock")
    problems += _reclaim_refused(loser, tick, ctx.run_id, ev)

    following_claim = loser.claim(following, ctx.run_id)
    said = _said(loser, following_claim)
    ev.add(f"then {loser.worker} claims the next tick {tick_name(following)}: {said}")
    if not following_claim.won:
        problems.append(f"the next tick {tick_name(following)} could not be claimed")
    elif not loser.complete(following, following_claim):
        problems.append(f"{loser.worker} could not complete the next tick and release")
    if problems:
        raise CheckFailed("; ".join(problems))
    return (
        f"{winner.worker} won tick {name} (LockIndex {claim.lock_index}), {loser.worker} was "
        f"told it was taken by {winner.worker}; refused again after release; next tick claimed "
        f"(LockIndex {following_claim.lock_index})"
    )


def _racers(ctx: VerifyContext, ledger_for: LedgerFactory) -> tuple[Racer, Racer]:
    shared = ctx.shared_job()
    if shared is None:
        raise CheckSkipped("needs a job that two workers with tokens may run")
    job, first, second = shared
    lock_key = f"{ctx.verify_key(job, 'tick-once')}/.lock"
    ctx.cleanup.key(ctx.client(first), lock_key)
    racers = []
    for worker in (first, second):
        client = ctx.client(worker)
        racers.append(
            Racer(worker, ledger_for(client, lock_key), verify_session(ctx, client, "tick-once"))
        )
    return racers[0], racers[1]


def race(a: Racer, b: Racer, tick: datetime, run_id: str) -> tuple[Claim, Claim]:
    """Both claims of `tick`, sent at the same moment (released together by a barrier)."""
    start = threading.Barrier(2)
    claims: dict[str, Claim] = {}
    errors: list[BaseException] = []

    def claim(racer: Racer) -> None:
        start.wait()
        try:
            claims[racer.worker] = racer.claim(tick, run_id)
        except Exception as exc:  # re-raised in the check's thread, below
            errors.append(exc)

    threads = [threading.Thread(target=claim, args=(r,), daemon=True) for r in (a, b)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(RACE_TIMEOUT)
    if errors:
        raise errors[0]
    if len(claims) != 2:
        raise CheckFailed(f"a racing claim did not answer within {RACE_TIMEOUT:g} s")
    return claims[a.worker], claims[b.worker]


def _loser_told(
    loser: Racer, claim: Claim, winner: Racer, tick: datetime, ev: Evidence
) -> list[str]:
    """The loser must be refused because the tick is taken, and the record must say by whom."""
    problems = []
    if not claim.tick_taken:
        problems.append(
            f"{loser.worker} lost the race but was not told tick {tick_name(tick)} is taken"
        )
    record, _ = loser.ledger.read(tick)
    taken_by = None if record is None else record.worker
    ev.add(f"{loser.worker} reads tick {tick_name(tick)}: taken by {taken_by}")
    if taken_by != winner.worker:
        problems.append(
            f"the record of tick {tick_name(tick)} names {taken_by}, not the winner {winner.worker}"
        )
    return problems


def _reclaim_refused(loser: Racer, tick: datetime, run_id: str, ev: Evidence) -> list[str]:
    """With the lock free again, a claim of the same tick must be refused for the tick alone."""
    again = loser.claim(tick, run_id)
    ev.add(
        f"{loser.worker} claims tick {tick_name(tick)} again, the lock free: {_said(loser, again)}"
    )
    if again.won:
        loser.complete(tick, again)  # frees the lock for the next step; the tick ran twice
        return [
            f"a second claim of tick {tick_name(tick)} after release won: the tick would run twice"
        ]
    if not again.tick_taken:
        return [
            f"a second claim of tick {tick_name(tick)} was refused, but not because it is taken"
        ]
    return []


def _said(racer: Racer, claim: Claim) -> str:
    if claim.won:
        return f"{racer.worker} won (LockIndex {claim.lock_index})"
    reasons = ["tick taken"] if claim.tick_taken else []
    if claim.lock_refusal:
        reasons.append(f"lock: {claim.lock_refusal}")
    return f"{racer.worker} refused ({', '.join(reasons) or 'no reason given'})"
