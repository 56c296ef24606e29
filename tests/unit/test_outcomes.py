"""The one vocabulary of outcomes: one word, one meaning, and each place's subset of it."""

from __future__ import annotations

import ast
import json
import zipfile
from datetime import datetime, timezone
from pathlib import Path

import pytest

from provision import fencing
from provision.ledger import records
from provision.ledger.records import RECORD_FORMAT, decode
from provision.outcomes import (
    FINISHED,
    LEDGER_OUTCOMES,
    PREVIOUS_METRIC_WORDS,
    RUN_METRIC_OUTCOMES,
    RUN_OUTCOMES,
    SCHEDULER_METRIC_OUTCOMES,
    TURN_OUTCOMES,
    VERDICTS,
    Outcome,
)
from provision.runner.metrics import PREVIOUS_TICKS_HELP

TICK = datetime(2026, 12, 6, 2, 0, tzinfo=timezone.utc)
# What every release so far writes in a tick's record: a fleet upgraded one replica at a time
# reads the others' records, so none of these may change.
PREVIOUS_RECORD_WORDS = {
    "running",
    "succeeded",
    "failed",
    "lost",
    "interrupted",
    "timed-out",
    "missed",
    "paused",
    "unreadable",
}
# New in this release: the release before reads them `unreadable` (a tick taken: never run again
# by it), and docs/operations.md "Outcome words" says so.
NEW_RECORD_WORDS = {"blackout", "aborted", "cancelled", "buffered"}
RECORD_WORDS = PREVIOUS_RECORD_WORDS | NEW_RECORD_WORDS


def test_the_ledgers_words_are_the_ones_every_release_writes() -> None:
    assert {outcome.value for outcome in LEDGER_OUTCOMES} == RECORD_WORDS
    assert FINISHED < LEDGER_OUTCOMES


def test_each_word_is_one_member_and_the_old_names_are_the_same_vocabulary() -> None:
    words = [outcome.value for outcome in Outcome]
    assert len(words) == len(set(words))
    assert records.TickOutcome is Outcome and fencing.Outcome is Outcome
    assert Outcome.JOB_TIMED_OUT is Outcome.TIMED_OUT  # the embedding app's old name


def test_every_subset_is_of_the_vocabulary_and_the_metric_labels_are_unique() -> None:
    for subset in (RUN_OUTCOMES, VERDICTS, TURN_OUTCOMES):
        assert subset <= set(Outcome)
    assert VERDICTS <= RUN_OUTCOMES
    for labels in (RUN_METRIC_OUTCOMES, SCHEDULER_METRIC_OUTCOMES):
        assert len(labels) == len(set(labels))
        assert {Outcome(label) for label in labels} <= set(Outcome)
    assert "job-timed-out" not in RUN_METRIC_OUTCOMES + SCHEDULER_METRIC_OUTCOMES


def test_a_wait_that_ran_out_and_a_job_past_its_timeout_are_two_words() -> None:
    assert Outcome.GAVE_UP.value == "gave-up" and Outcome.TIMED_OUT.value == "timed-out"
    assert Outcome.GAVE_UP not in LEDGER_OUTCOMES  # nothing ran: no record


@pytest.mark.parametrize("word", sorted(RECORD_WORDS))
def test_a_record_word_is_read_as_itself(word: str) -> None:
    value = json.dumps({"format": RECORD_FORMAT, "tick": "x", "outcome": word}).encode()
    assert decode(TICK, value).outcome.value == word


@pytest.mark.parametrize("word", ["ran", "gave-up", "skipped", "claimed", "error", ["x"], None])
def test_a_word_that_is_no_records_is_read_unreadable(word: object) -> None:
    value = json.dumps({"format": RECORD_FORMAT, "tick": "x", "outcome": word}).encode()
    assert decode(TICK, value).outcome is Outcome.UNREADABLE


# The release a fleet upgrades from (tests/integration/previous_release.py keeps its wheel).
PREVIOUS_WHEEL = (
    Path(__file__).resolve().parents[1] / "data/previous-release/lockctl-0.1.0-py3-none-any.whl"
)


def _previous_source(path: str) -> ast.Module:
    with zipfile.ZipFile(PREVIOUS_WHEEL) as wheel:
        return ast.parse(wheel.read(path).decode())


def _enum_words(module: ast.Module, name: str) -> set[str]:
    (found,) = [n for n in module.body if isinstance(n, ast.ClassDef) and n.name == name]
    return {
        n.value.value
        for n in found.body
        if isinstance(n, ast.Assign) and isinstance(n.value, ast.Constant)
    }


def _constant(module: ast.Module, name: str) -> object:
    for node in module.body:
        if isinstance(node, ast.Assign) and [getattr(t, "id", None) for t in node.targets] == [
            name
        ]:
            return ast.literal_eval(node.value)
    raise AssertionError(f"{name} not found")


def test_the_previous_release_writes_and_reads_the_same_record_words() -> None:
    """A mixed fleet: each release reads every record the other writes, word for word."""
    previous = _enum_words(_previous_source("provision/ledger/records.py"), "TickOutcome")
    assert previous == {outcome.value for outcome in LEDGER_OUTCOMES} - NEW_RECORD_WORDS
    assert previous == PREVIOUS_RECORD_WORDS


def test_the_previous_release_reads_a_new_word_as_a_taken_tick() -> None:
    """Its decode maps a word it does not know to `unreadable`, and an unreadable record is a
    tick taken (never claimed again): a `blackout` record stops it running the tick too."""
    source = _previous_source("provision/ledger/records.py")
    text = ast.unparse(source)
    # its decode: the enum of the word, and any word not a member read as unreadable
    decoding = "outcome = TickOutcome(raw.get('outcome'))\n    except ValueError:\n"
    assert decoding + "        outcome = TickOutcome.UNREADABLE" in text
    assert not NEW_RECORD_WORDS & _enum_words(source, "TickOutcome")


def test_every_metric_word_of_the_previous_release_is_read_in_todays_words() -> None:
    """Its runner's words are today's with the same meaning, or translated (timed-out was a
    --wait that ran out), and its file is told apart by the help text it wrote."""
    runner = _previous_source("provision/runner/fencing.py")
    previous = _enum_words(runner, "Outcome") | {"error"}
    for word in previous:
        today = PREVIOUS_METRIC_WORDS.get(word, word)
        assert today in RUN_METRIC_OUTCOMES, word
    assert PREVIOUS_METRIC_WORDS == {"timed-out": "gave-up", "job-timed-out": "timed-out"}
    metrics = _previous_source("provision/runner/metrics.py")
    assert _constant(metrics, "TICKS_HELP") == PREVIOUS_TICKS_HELP
