"""bench/simulate.py: the real tick core under simulated faults finds no violation; each known
bug planted into the core from outside is reported, under its invariant's name; a seed replays
exactly. Deterministic: virtual time only."""

from __future__ import annotations

import pytest

from bench import simulate
from bench.simulate import PLANTS, SimConfig
from provision.tick import core, held, pool

# the invariants a plant may break first, in the default run (where the trace goes decides
# which of its consequences comes first)
CAUGHT_BY = {
    # never told to end: it runs past its bound beside another, or forever (still running)
    "no-fence": {"overlap", "unaccounted", "abort-unstopped"},
    "check-flag": {"check-after-bound"},
    "blind-claim": {"loser-wrote"},
    "no-missed": {"unaccounted"},
    # fenced late: check() passes past the bound, the body runs past it beside another, or a
    # claim answered long after it was sent starts its body on a lock since taken (its
    # LockIndex below the one a later run had)
    "late-confirm": {"check-after-bound", "overlap", "token"},
    "no-cap": {"over-cap"},
    # windows ignored: a window's tick runs (at its turn, or as a catch-up)
    "no-blackout": {"blackout-run"},
    "no-stop-wait": {"stop-left-running"},
    # a backfill's tick run again by the next replica that hears it, or never run
    "backfill-blind": {"tick-twice"},
    "backfill-none": {"backfill-unrun"},
    # an abort that stops nothing, or a note that stops a run it does not name
    "abort-deaf": {"abort-unstopped"},
    "abort-any": {"abort-stray"},
    # overlap = "cancel" never carried out: a run that outlasts its interval goes on
    "cancel-deaf": {"cancel-unheeded"},
    # a tick kept `buffered` dropped as if settled: left buffered for good
    "buffer-dropped": {"buffered-lost"},
}


def test_a_run_with_faults_finds_no_violation() -> None:
    report = simulate.simulate(SimConfig(ticks=5000))
    assert report.violations == ()
    assert report.ticks >= 5000
    assert report.faults >= 50
    counts = report.counts
    # the faults did what they are for: runs fenced, ticks missed, replicas killed and paused
    assert counts["fenced"] > 0 and counts["missed"] > 0
    assert counts["killed"] > 0 and counts["resumed"] > 0
    assert counts["sigterm"] > 0 and counts["exited"] > 0  # graceful stops ended
    assert counts["blackout-record"] > 0 and counts["blackout"] > 0  # windows held ticks
    assert report.last_line().startswith(f"simulated {report.ticks} ticks, {report.faults} faults")


@pytest.mark.parametrize("plant", sorted(PLANTS))
def test_each_planted_bug_is_reported_in_the_default_run(plant: str) -> None:
    report = simulate.simulate(SimConfig(plants=(plant,)))
    assert report.violations, plant
    assert report.violations[0].invariant in CAUGHT_BY[plant]
    if "tick-twice" not in CAUGHT_BY[plant]:  # the claim arbitrates what the plant let through
        assert "tick-twice" not in {v.invariant for v in report.violations}
    assert any("VIOLATION" in line for line in report.trace)


def test_a_plant_is_put_back_after_its_run() -> None:
    originals = (
        held.apply_fence,
        held.vouched,
        core.claimable,
        core.record_missed,
        core.holding_window,
        core.may_backfill,
        core.stops,
        core.overlap_action,
        core.still_buffered,
    )
    simulate.simulate(SimConfig(ticks=50, plants=tuple(sorted(PLANTS))))
    assert (
        held.apply_fence,
        held.vouched,
        core.claimable,
        core.record_missed,
        core.holding_window,
        core.may_backfill,
        core.stops,
        core.overlap_action,
        core.still_buffered,
    ) == originals
    assert pool.confirmation_time(1.0, 2.0) == 1.0


def test_a_seed_replays_its_run_exactly() -> None:
    config = SimConfig(seed=7, ticks=1500, digest=True)
    first, again = simulate.simulate(config), simulate.simulate(config)
    other = simulate.simulate(SimConfig(seed=8, ticks=1500, digest=True))
    assert (first.digest, first.trace, first.counts) == (again.digest, again.trace, again.counts)
    assert first.digest != other.digest


def test_a_violation_is_printed_with_its_seed_and_trace_and_the_last_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code = simulate.main(["--plant", "blind-claim", "--seed", "3", "--trace", "5"])
    out = capsys.readouterr().out.splitlines()
    assert code == 1
    assert out[0].startswith("VIOLATION loser-wrote")
    assert any("--seed 3 --plant blind-claim" in line for line in out)
    assert out[-1].endswith("(seed 3)") and out[-1].startswith("simulated ")
