"""lockctl's one vocabulary of outcomes: each word has one meaning wherever it appears (a tick
record, a run's result, an event, a metric label), and named subsets say which words each place
may produce. Pure, and below every other layer: the ledger, fencing, runner, scheduler and embed
all speak it.

The ledger's words are what records on Consul hold: a fleet upgrades one replica at a time and
every release reads what the others write, so a record's word is never renamed.
"""

from __future__ import annotations

import enum


class Outcome(str, enum.Enum):
    """How a tick, a run or a turn at a tick ended: one word, one meaning.

    A tick's record (the ledger on Consul; never renamed):
        running      claimed; the job runs (or its runner died before completing the record)
        succeeded    the job exited 0 while the lock was held
        failed       the job exited non-zero (or by a signal) while the lock was held
        lost         the lock was lost while the job ran: the job was fenced, the lock not released
        interrupted  a stop was requested (a signal to the runner) and the job stopped
        timed-out    the job ran past its `timeout` and was stopped; the lock released
        aborted      an operator asked for this run's end (`lockctl abort`: its record says who
                     and why); the job was stopped as a timed-out one is, the lock released, and
                     it is not retried: an operator's stop, not a failure (it never pages; new
                     in this release: the release before reads it `unreadable`)
        cancelled    the job's next tick came while it still ran, and its overlap = "cancel" ended
                     it (stopped as an aborted run is, the lock released, then the next tick run
                     by the same replica): the job's own policy, not a failure (it never pages;
                     new in this release: the release before reads it `unreadable`)
        buffered     the tick came while the job's previous run still ran, and its overlap =
                     "buffer_one" kept it: the first replica whose claim finds the lock free
                     (the holder, as its run ends) runs it over this record, within its
                     start deadline, else it is recorded missed (new in this release: the
                     release before reads it `unreadable`, a tick taken, and never runs it)
        missed       nobody claimed the tick within its start deadline (too late for it)
        paused       the job was paused (lockctl pause) when the tick came: not run
        blackout     the tick fell in one of the job's blackout windows (its record names the
                     window): not run, not missed, never caught up (new in this release: the
                     release before reads it `unreadable`, a tick taken)
        unreadable   a reader's word: the key holds something that is not a tick record
    A run (`lockctl run`, an embedded call) and a turn at a tick, beyond those:
        ran          the job ran under the lock and ended (succeeded or failed: its exit status)
        skipped      not ours: another session held the lock or took the tick, or it is paused
        gave-up      `lockctl run --wait` ran out of waiting for the lock: nothing ran
        error        the tick could not be tried for a reason of lockctl's own (no answer to
                     parse, the command cannot start, a refused token)
        consul-unavailable  Consul did not answer the claim: not run (fail closed)
        claimed      a turn won the tick here and its record was completed (the body may have
                     been stopped before it started: the record says how it ended)
        unsettled    nothing settled the turn (stopped before its claim)
    """

    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    LOST = "lost"
    INTERRUPTED = "interrupted"
    TIMED_OUT = "timed-out"
    ABORTED = "aborted"
    CANCELLED = "cancelled"
    BUFFERED = "buffered"
    MISSED = "missed"
    PAUSED = "paused"
    BLACKOUT = "blackout"
    UNREADABLE = "unreadable"
    RAN = "ran"
    SKIPPED = "skipped"
    GAVE_UP = "gave-up"
    ERROR = "error"
    CONSUL_UNAVAILABLE = "consul-unavailable"
    CLAIMED = "claimed"
    UNSETTLED = "unsettled"
    # Deprecated, for one release: the name an embedding app compared a RunOutcome's `outcome`
    # with when the word was `job-timed-out`. The same member as TIMED_OUT.
    JOB_TIMED_OUT = "timed-out"


# What a tick's record on Consul may hold (every release since the ledger's first writes and
# reads these, `blackout`, `cancelled` and `buffered` since this one); any other word in a
# record is read as `unreadable`.
LEDGER_OUTCOMES = frozenset(
    {
        Outcome.BLACKOUT,
        Outcome.RUNNING,
        Outcome.SUCCEEDED,
        Outcome.FAILED,
        Outcome.LOST,
        Outcome.INTERRUPTED,
        Outcome.TIMED_OUT,
        Outcome.ABORTED,
        Outcome.CANCELLED,
        Outcome.BUFFERED,
        Outcome.MISSED,
        Outcome.PAUSED,
        Outcome.UNREADABLE,
    }
)
# A record of a run that ended (its runner completed it).
FINISHED = frozenset(
    {
        Outcome.SUCCEEDED,
        Outcome.FAILED,
        Outcome.LOST,
        Outcome.INTERRUPTED,
        Outcome.TIMED_OUT,
        Outcome.ABORTED,
        Outcome.CANCELLED,
    }
)
# A run an operator ended (`lockctl abort`): said, counted, never a failure that pages.
OPERATOR_STOPS = frozenset({Outcome.ABORTED})
# A run the job's own policy ended (overlap = "cancel": its next tick came): the same.
POLICY_STOPS = frozenset({Outcome.CANCELLED})
# What a run ends in: `lockctl run`'s result and an embedded call's RunOutcome (`aborted`:
# `lockctl run` only, an embedded call hears no abort).
RUN_OUTCOMES = frozenset(
    {
        Outcome.RAN,
        Outcome.SKIPPED,
        Outcome.MISSED,
        Outcome.LOST,
        Outcome.INTERRUPTED,
        Outcome.TIMED_OUT,
        Outcome.GAVE_UP,
        Outcome.ABORTED,
    }
)
# A verdict the fencing decision settles while the job runs.
VERDICTS = frozenset({Outcome.RAN, Outcome.LOST, Outcome.INTERRUPTED, Outcome.TIMED_OUT})
# What one turn at a tick came to (tick/once.py).
TURN_OUTCOMES = frozenset(
    {
        Outcome.CLAIMED,
        Outcome.SKIPPED,
        Outcome.PAUSED,
        Outcome.BLACKOUT,
        Outcome.MISSED,
        Outcome.ERROR,
        Outcome.UNSETTLED,
    }
)
# The `outcome` labels of lockctl_ticks_total, in the order they are exposed: `lockctl run
# --metrics-textfile`'s (a run's outcome, or an error before it had one) and the scheduler's
# /metrics (a record's, a turn's, its error, Consul not answering a claim).
RUN_METRIC_OUTCOMES = (
    Outcome.RAN.value,
    Outcome.SKIPPED.value,
    Outcome.GAVE_UP.value,
    Outcome.LOST.value,
    Outcome.INTERRUPTED.value,
    Outcome.MISSED.value,
    Outcome.TIMED_OUT.value,
    Outcome.ERROR.value,
    Outcome.BLACKOUT.value,
    Outcome.ABORTED.value,
)
SCHEDULER_METRIC_OUTCOMES = (
    Outcome.RAN.value,
    Outcome.SKIPPED.value,
    Outcome.MISSED.value,
    Outcome.LOST.value,
    Outcome.INTERRUPTED.value,
    Outcome.TIMED_OUT.value,
    Outcome.ERROR.value,
    Outcome.CONSUL_UNAVAILABLE.value,
    Outcome.BLACKOUT.value,
    Outcome.ABORTED.value,
    Outcome.CANCELLED.value,
    Outcome.BUFFERED.value,
)
# The words the release before this one used for lockctl_ticks_total and the `--wait` event:
# `timed-out` was a `--wait` that ran out, `job-timed-out` a job past its timeout. A metrics
# file it left is read with them turned into today's words (runner/metrics.py).
PREVIOUS_METRIC_WORDS = {
    "timed-out": Outcome.GAVE_UP.value,
    "job-timed-out": Outcome.TIMED_OUT.value,
}
