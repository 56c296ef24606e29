"""The lock checks of `lockctl verify`: one holder at a time, hand-over on release and after
LockDelay, a growing LockIndex, consistency headers, and expiry of an unrenewed session."""

from __future__ import annotations

import itertools
import threading
import time

from provision.consul import Consul
from provision.spec import Job
from provision.system.deadline import Deadline, attempts, wait_until
from provision.verify.context import VerifyContext
from provision.verify.evidence import (
    VERIFY_TTL,
    CheckFailed,
    CheckSkipped,
    Evidence,
    verify_session,
)

LOCK_DELAY_TOLERANCE = 0.5  # seconds either side of the configured LockDelay
POLL = 0.05  # seconds between acquire attempts where a check measures a delay


def _shared_job(ctx: VerifyContext) -> tuple[Job, str, str]:
    """A job two workers with tokens may run, and those two; else the check is skipped."""
    shared = ctx.shared_job()
    if shared is None:
        raise CheckSkipped("needs a job that two workers with tokens may run")
    return shared


def _pair(
    ctx: VerifyContext, check: str, lock_delay: float = 0.0
) -> tuple[Consul, str, Consul, str, str]:
    job, first, second = _shared_job(ctx)
    a, b = ctx.client(first), ctx.client(second)
    key = ctx.cleanup.key(a, ctx.verify_key(job, check))
    return (
        a,
        verify_session(ctx, a, check, lock_delay),
        b,
        verify_session(ctx, b, check, lock_delay),
        key,
    )


def check_single_holder(ctx: VerifyContext, ev: Evidence, rounds: int = 5) -> str:
    a, session_a, b, session_b, key = _pair(ctx, "single-holder")
    for round_number in range(1, rounds + 1):
        start = threading.Barrier(2)
        results: dict[str, bool] = {}
        racers = (("A", a, session_a), ("B", b, session_b))
        threads = [
            threading.Thread(target=_race, args=(start, results, name, client, session_id, key))
            for name, client, session_id in racers
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=30)
        ev.add(f"round {round_number}: A={results.get('A')} B={results.get('B')}")
        if sorted(results.values()) != [False, True]:
            raise CheckFailed(f"round {round_number}: acquire results {results}, not exactly one")
        winner = (a, session_a) if results["A"] else (b, session_b)
        winner[0].kv.put(key, release=winner[1])
    return f"exactly one of two racing sessions acquired, {rounds} of {rounds} rounds"


def _race(
    start: threading.Barrier,
    results: dict[str, bool],
    name: str,
    client: Consul,
    session_id: str,
    key: str,
) -> None:
    start.wait()  # both threads send their acquire at the same moment
    results[name] = client.kv.put(key, acquire=session_id)


def check_release_handover(ctx: VerifyContext, ev: Evidence) -> str:
    a, session_a, b, session_b, key = _pair(ctx, "handover", lock_delay=15.0)
    if not a.kv.put(key, acquire=session_a):
        raise CheckFailed("the first session could not acquire a free key")
    if b.kv.put(key, acquire=session_b):
        raise CheckFailed("the second session acquired a key the first one holds")
    released = time.monotonic()
    a.kv.put(key, release=session_a)
    acquired = b.kv.put(key, acquire=session_b)
    took = time.monotonic() - released
    ev.add(f"release, then acquire by the other session: {acquired} after {took * 1000:.1f} ms")
    if not acquired:
        raise CheckFailed("after a release the other session could not acquire at once")
    b.kv.put(key, release=session_b)
    return f"the other session acquired {took * 1000:.1f} ms after release (no lock-delay)"


def check_lock_delay(ctx: VerifyContext, ev: Evidence) -> str:
    job = _shared_job(ctx)[0]
    delay = job.timings.lock_delay
    a, session_a, b, session_b, key = _pair(ctx, "lock-delay", lock_delay=delay)
    if not a.kv.put(key, acquire=session_a):
        raise CheckFailed("the first session could not acquire a free key")
    destroyed = time.monotonic()
    deadline = Deadline(delay + 10)
    a.session.destroy(session_a)
    acquires = (n for n in attempts(deadline, POLL) if b.kv.put(key, acquire=session_b))
    tries = next(acquires, None)  # how many acquires it took; None: none succeeded in time
    if tries is None:
        raise CheckFailed(f"no acquire within LockDelay {delay:g}s + 10 s of destroy")
    measured = time.monotonic() - destroyed
    b.kv.put(key, release=session_b)
    ev.add(f"configured LockDelay {delay:g} s (job {job.name}); measured {measured:.3f} s")
    ev.add(f"{tries} acquire attempts, {POLL * 1000:.0f} ms apart")
    if measured < delay - LOCK_DELAY_TOLERANCE:
        raise CheckFailed(f"acquired after {measured:.3f} s, before LockDelay {delay:g} s")
    if measured > delay + LOCK_DELAY_TOLERANCE + 1.0:
        raise CheckFailed(f"acquired only after {measured:.3f} s, LockDelay is {delay:g} s")
    return f"destroy -> next acquire {measured:.3f} s (LockDelay {delay:g} s)"


def check_fencing_index(ctx: VerifyContext, ev: Evidence) -> str:
    a, session_a, b, session_b, key = _pair(ctx, "fencing-index")
    indexes = []
    for client, session_id in ((a, session_a), (b, session_b), (a, session_a)):
        if not client.kv.put(key, acquire=session_id):
            raise CheckFailed("a session could not acquire the free key")
        entry, _ = client.kv.get(key, consistency="consistent")
        indexes.append(entry.lock_index if entry else -1)
        client.kv.put(key, release=session_id)
    ev.add(f"LockIndex after three acquires: {indexes}")
    if not all(later > earlier for earlier, later in itertools.pairwise(indexes)):
        raise CheckFailed(f"LockIndex did not increase with every acquire: {indexes}")
    return f"LockIndex {' < '.join(map(str, indexes))}"


def check_consistency_headers(ctx: VerifyContext, ev: Evidence) -> str:
    a, _session_a, _b, _session_b, key = _pair(ctx, "headers")
    a.kv.put(key, b"x")
    missing = []
    for mode in ("default", "stale", "consistent"):
        _, meta = a.kv.get(key, consistency=mode)
        ev.add(
            f"{mode:>10}: X-Consul-Index={meta.index} X-Consul-Knownleader={meta.known_leader} "
            f"X-Consul-Lastcontact={meta.last_contact_ms}"
        )
        if None in (meta.index, meta.known_leader, meta.last_contact_ms):
            missing.append(mode)
    if missing:
        raise CheckFailed(f"consistency headers missing on {', '.join(missing)} reads")
    return "default, stale and consistent reads all carry index, leader and last-contact headers"


def check_ttl_expiry(ctx: VerifyContext, ev: Evidence) -> str:
    job, first, second = _shared_job(ctx)
    delay = job.timings.lock_delay
    a, b = ctx.client(first), ctx.client(second)
    key = ctx.cleanup.key(a, ctx.verify_key(job, "ttl-expiry"))
    session_a = verify_session(ctx, a, "ttl-expiry", delay)
    if not a.kv.put(key, acquire=session_a):
        raise CheckFailed("the first session could not acquire a free key")
    created = time.monotonic()
    invalid_by, free_by = Deadline(2 * VERIFY_TTL + 10), Deadline(2 * VERIFY_TTL + delay + 15)
    # Left unrenewed on purpose: the session must expire by itself.
    if not wait_until(invalid_by, lambda: a.session.info(session_a) is None, 0.2):
        raise CheckFailed(f"session still valid {2 * VERIFY_TTL + 10:g} s after its last renew")
    expired = time.monotonic() - created
    # Made only now, so it cannot expire meanwhile.
    session_b = verify_session(ctx, b, "ttl-expiry", delay)
    if not wait_until(free_by, lambda: b.kv.put(key, acquire=session_b), POLL):
        raise CheckFailed("key not acquirable after expiry plus LockDelay")
    acquirable = time.monotonic() - created
    b.kv.put(key, release=session_b)
    ev.add(f"TTL {VERIFY_TTL:g} s, LockDelay {delay:g} s: invalidated after {expired:.1f} s")
    ev.add(f"acquirable by another session at {acquirable:.1f} s")
    if not VERIFY_TTL - 0.5 <= expired <= 2 * VERIFY_TTL + 2:
        raise CheckFailed(f"invalidated after {expired:.1f} s, not within TTL..2xTTL")
    return f"invalidated after {expired:.1f} s (TTL {VERIFY_TTL:g} s), free at {acquirable:.1f} s"
