"""What a notification says (pure): which outcome a core's note decided, whether a success is a
recovery, and the JSON body a webhook receives (with a `text` line for chat tools).

The outcomes, from the record the deciding replica wrote:

    completed, failed or timed-out  -> "failed"   (the replica that ran it)
    completed, lost                 -> "lost"     (the replica whose run was fenced)
    missed, a `missed` record       -> "missed"   (the one replica whose record_unrun wrote it)
    completed, succeeded            -> "succeeded": the ping; "recovered" when the job's
                                       previous scheduled tick's record is failed, timed-out,
                                       lost or missed (`recovered`); or, when that tick is
                                       recorded missed only after this success, told by the
                                       replica that records it (notifier.py `_after_missed`)

An interrupted run (a stop) and a paused tick tell nobody: neither is the job's failure.

A `failed`, `lost` or `missed` outcome that the job's previous scheduled tick's record already
had is a repeat (`repeated`): not told again, unless the notify block's `repeat_after` window
turned since that tick. The state is the ledger's, so whichever replica decides next knows it.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Any

from provision.ledger.records import TickRecord, tick_name
from provision.outcomes import Outcome
from provision.schedule import Schedule
from provision.system.tails import mask_secrets
from provision.system.text import printable
from provision.tick.edge import Note

OUTPUT_LINES = 10  # the last lines of each stream a body carries
LINE_LIMIT = 300  # characters of one output line in a body
TEXT_LIMIT = 500  # characters of the `text` line
SUCCEEDED = "succeeded"
_WORDS = {
    Outcome.SUCCEEDED: SUCCEEDED,
    Outcome.FAILED: "failed",
    Outcome.TIMED_OUT: "failed",
    Outcome.LOST: "lost",
    Outcome.MISSED: "missed",
}
# a success after a tick that ended so is a recovery
NOT_WELL = frozenset({Outcome.FAILED, Outcome.TIMED_OUT, Outcome.LOST, Outcome.MISSED})


def decided(note: Note) -> tuple[str, TickRecord] | None:
    """The outcome word and the record of a note that decided a tick here, or None: a run's
    completion, or the record of a tick nobody ran that this replica wrote."""
    record = note.record
    if record is None or note.kind not in ("completed", "missed"):
        return None
    word = _WORDS.get(record.outcome)
    if word is None or (note.kind == "missed") != (word == "missed"):
        return None
    return word, record


def recovered(previous: TickRecord | None) -> bool:
    """Whether a success recovers the job: its previous tick's record says it did not go well.
    No record (not recorded yet, or pruned) is no failure known."""
    return previous is not None and previous.outcome in NOT_WELL


def repeated(
    word: str, tick: datetime, previous: TickRecord | None, repeat_after: float | None
) -> bool:
    """Whether the outcome `word` of `tick` only repeats its previous tick's (`previous`, the
    record of the job's scheduled tick before it), so that it is not told again: the same
    outcome (a timeout is a failure), and no `repeat_after` window (seconds, aligned on the
    Unix epoch, as every replica's are) began between the two ticks. No record is no outcome
    known: told."""
    if previous is None or _WORDS.get(previous.outcome) != word:
        return False
    if repeat_after is None:
        return True
    return tick.timestamp() // repeat_after == previous.tick.timestamp() // repeat_after


def previous_tick(schedule: Schedule, tick: datetime) -> datetime | None:
    """The scheduled tick before `tick` (a trigger's instant included: the one before it)."""
    for earlier in schedule.ticks_at_or_before(tick):
        if earlier < tick:
            return earlier
    return None


def last_lines(tail: str | None, secrets: Iterable[str] = ()) -> list[str]:
    """The last OUTPUT_LINES lines of an output tail (already masked as the record keeps it),
    each printable and bounded, with `secrets` (the notifications' own URLs) masked too."""
    if not tail:
        return []
    lines = mask_secrets(tail, secrets).rstrip("\n").split("\n")
    return [printable(line, LINE_LIMIT) for line in lines[-OUTPUT_LINES:]]


def text_line(job: str, event: str, record: TickRecord) -> str:
    """One plain line for a chat tool (Slack's and Mattermost's `text`)."""
    tick = tick_name(record.tick)
    if event == "missed":
        return f"lockctl: {job} missed tick {tick}: nobody ran it within its start deadline"
    where = f" on {record.worker}" if record.worker else ""
    if event == "recovered":
        return f"lockctl: {job} recovered{where}: tick {tick} succeeded after a failed one"
    if event == "lost":
        return f"lockctl: {job} lost its lock{where} during tick {tick}: the run was stopped"
    status = "" if record.exit_status is None else f", exit status {record.exit_status}"
    how = "timed out" if record.outcome is Outcome.TIMED_OUT else "failed"
    return f"lockctl: {job} {how}{where}: tick {tick}{status}"


def webhook_body(
    job: str, event: str, record: TickRecord, notify: str, secrets: Iterable[str] = ()
) -> dict[str, Any]:
    """The JSON a `notify` block's URL is sent: the job, the tick, what happened and where,
    the output's last lines, and `text` for chat tools."""
    known = list(secrets)
    stdout, stderr = last_lines(record.stdout, known), last_lines(record.stderr, known)
    text = text_line(job, event, record)
    if event == "failed" and (stderr or stdout):
        text += f": {(stderr or stdout)[-1]}"
    return {
        "job": job,
        "tick": tick_name(record.tick),
        "event": event,
        "outcome": record.outcome.value,
        "worker": record.worker,
        "exit_status": record.exit_status,
        "attempts": None if record.attempts is None else list(record.attempts),
        "duration_s": record.duration,
        "lock_index": record.lock_index,
        "notify": notify,
        "output": {"stdout": stdout, "stderr": stderr},
        "text": printable(mask_secrets(text, known), TEXT_LIMIT),
    }
