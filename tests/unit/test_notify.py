"""Notifications (provision/notify/, system/notify_rules.py): the URL files, the outcome a note
decided, the recovered rule, the webhook's body, masking, the sender's bounds and tries, and
the notifier on real TickCores in virtual time (a fleet of two on the in-memory Consul)."""

from __future__ import annotations

import io
import json
import threading
from collections.abc import Callable
from dataclasses import replace
from datetime import datetime
from pathlib import Path
from types import SimpleNamespace

import pytest
import requests
from tick_fleet import KEYS, START, TIMINGS, at

from provision.embed.called import Calls, CallTurn
from provision.errors import InputError
from provision.ledger.records import TickOutcome, TickRecord
from provision.notify.message import (
    OUTPUT_LINES,
    decided,
    last_lines,
    previous_tick,
    recovered,
    repeated,
    webhook_body,
)
from provision.notify.notifier import JobNotify, Notifier, deliveries, fail_url, load_job
from provision.notify.sender import ATTEMPTS, Delivery, Lanes, Sender
from provision.schedule import parse_schedule
from provision.scheduler.report import CoreReport
from provision.system.notify_rules import (
    PING,
    Notifications,
    NotifyTarget,
    on_problem,
    read_url_file,
    url_file_problem,
)
from provision.system.secrets import Secret
from provision.tick.clock import VirtualClock
from provision.tick.core import CoreJob, Identity, TickCore
from provision.tick.edge import BodyEnd, Note, Run, StopHow
from provision.tick.memory import MemoryTickStore
from provision.tick.store import JobKeys
from provision.workers.job_config import notify_record, read_job

HOOK = "http://127.0.0.1:9/hooks/T0-SECRET-hook-4f1c2a"
PING_URL = "https://hc.example.net/ping/5b6e-SECRET-ping-77aa"
EVERY_10S = parse_schedule("@every 10s")


def _record(outcome: TickOutcome, tick: float = 0.0, **fields: object) -> TickRecord:
    return replace(TickRecord(at(tick), outcome, worker="w1", lock_index=3), **fields)  # type: ignore[arg-type]


def _job(
    on: tuple[str, ...] = ("failed", "missed", "lost", "recovered"),
    ping: bool = True,
    repeat_after: float | None = None,
) -> JobNotify:
    targets = (("chat", on, Secret(HOOK), repeat_after),)
    return JobNotify(KEYS, EVERY_10S, targets, Secret(PING_URL) if ping else None)


# -- the URL files ----------------------------------------------------------------------------
def _url_file(tmp_path: Path, text: str, mode: int = 0o600) -> Path:
    path = tmp_path / "hook.url"
    path.write_text(text)
    path.chmod(mode)
    return path


def test_a_url_file_of_mode_0600_gives_its_url_as_a_secret(tmp_path: Path) -> None:
    secret = read_url_file(_url_file(tmp_path, HOOK + "\n"))
    assert secret.reveal() == HOOK and HOOK not in repr(secret) and HOOK not in str(secret)


@pytest.mark.parametrize(
    ("text", "mode", "said"),
    [
        (HOOK, 0o644, "has mode 0644; it holds a secret"),
        (HOOK, 0o640, "has mode 0640"),
        ("hooks.example/x", 0o600, "must hold one http:// or https:// URL on one line"),
        (HOOK + "\n" + HOOK, 0o600, "must hold one http:// or https:// URL"),
        ("", 0o600, "must hold one http:// or https:// URL"),
    ],
)
def test_a_url_file_that_cannot_be_used_is_refused_naming_the_file_never_the_url(
    tmp_path: Path, text: str, mode: int, said: str
) -> None:
    path = _url_file(tmp_path, text, mode)
    with pytest.raises(InputError) as caught:
        read_url_file(path)
    assert str(caught.value).startswith(f"{path}: ") and said in str(caught.value)
    assert "SECRET" not in str(caught.value)


def test_a_missing_url_file_is_refused_in_one_line(tmp_path: Path) -> None:
    with pytest.raises(InputError, match=r"gone\.url: cannot read URL file: No such file"):
        read_url_file(tmp_path / "gone.url")


def test_a_url_file_that_is_no_regular_file_is_refused(tmp_path: Path) -> None:
    folder = tmp_path / "hook.url"
    folder.mkdir(mode=0o700)
    with pytest.raises(InputError, match="cannot read URL file: a folder, not a regular file"):
        read_url_file(folder)


def test_paths_and_outcomes_are_checked_as_the_spec_and_the_config_check_them() -> None:
    assert url_file_problem("/etc/lockctl/ops.url") is None
    for bad in ("ops.url", HOOK, "/etc/lock ctl/x", "/etc/../x", 3):
        assert url_file_problem(bad), bad
    assert on_problem(["failed", "recovered"]) is None
    assert "exploded" in (on_problem(["failed", "exploded"]) or "")
    assert on_problem([]) and on_problem(["failed", "failed"]) and on_problem("failed")


def test_load_job_reads_every_url_file_and_names_the_one_that_fails(tmp_path: Path) -> None:
    good = _url_file(tmp_path, HOOK)
    bad = tmp_path / "ping.url"
    bad.write_text(PING_URL)
    bad.chmod(0o644)
    told = Notifications((NotifyTarget("chat", str(good)),), str(bad))
    with pytest.raises(InputError, match=r"ping\.url: URL file has mode 0644"):
        load_job(KEYS, EVERY_10S, told)
    bad.chmod(0o600)
    job = load_job(KEYS, EVERY_10S, told)
    assert job.secrets() == [HOOK, PING_URL] and "SECRET" not in repr(job)


# -- what a note decided ----------------------------------------------------------------------
@pytest.mark.parametrize(
    ("kind", "outcome", "word"),
    [
        ("completed", TickOutcome.SUCCEEDED, "succeeded"),
        ("completed", TickOutcome.FAILED, "failed"),
        ("completed", TickOutcome.TIMED_OUT, "failed"),
        ("completed", TickOutcome.LOST, "lost"),
        ("completed", TickOutcome.INTERRUPTED, None),  # a stop is nobody's failure
        ("missed", TickOutcome.MISSED, "missed"),
        ("missed", TickOutcome.PAUSED, None),  # a pause held the tick
        ("claimed", TickOutcome.RUNNING, None),
    ],
)
def test_the_outcome_a_note_decided(kind: str, outcome: TickOutcome, word: str | None) -> None:
    found = decided(Note(kind, "report", at(0), record=_record(outcome)))
    assert (found[0] if found else None) == word
    assert decided(Note(kind, "report", at(0))) is None  # no record: nothing decided


def test_a_success_recovers_from_a_failed_timed_out_lost_or_missed_tick_only() -> None:
    for outcome in TickOutcome:
        expected = outcome.value in ("failed", "timed-out", "lost", "missed")
        assert recovered(_record(outcome)) is expected, outcome
    assert not recovered(None)  # not recorded (yet), or pruned: no failure known
    assert previous_tick(EVERY_10S, at(20)) == at(10)
    assert previous_tick(EVERY_10S, at(20.5)) == at(20)  # a trigger's instant: the tick before


# -- the body -----------------------------------------------------------------------------------
F, T_O, L, M, S = (
    TickOutcome.FAILED,
    TickOutcome.TIMED_OUT,
    TickOutcome.LOST,
    TickOutcome.MISSED,
    TickOutcome.SUCCEEDED,
)


@pytest.mark.parametrize(
    ("word", "tick", "previous", "repeat_after", "is_repeat"),
    [
        ("failed", 10, None, None, False),  # no record before it (or pruned): told
        ("failed", 10, (S, 0), None, False),  # the first failure after a success
        ("failed", 10, (F, 0), None, True),  # a failure again: not told
        ("failed", 10, (T_O, 0), None, True),  # a timeout is a failure too
        ("failed", 10, (M, 0), None, False),  # after a miss: another outcome, told
        ("failed", 10, (L, 0), None, False),
        ("lost", 10, (L, 0), None, True),
        ("missed", 10, (M, 0), None, True),
        ("missed", 10, (F, 0), None, False),
        ("failed", 10, (F, 0), 3600.0, True),  # in the same hour's window
        ("failed", 3600, (F, 3590), 3600.0, False),  # the window turned: told again
        ("failed", 3610, (F, 3600), 3600.0, True),
        ("failed", 7200, (F, 0), 3600.0, False),  # a tick of a slow schedule: a window apart
    ],
)
def test_an_outcome_the_tick_before_had_is_a_repeat_until_its_window_turns(
    word: str,
    tick: float,
    previous: tuple[TickOutcome, float] | None,
    repeat_after: float | None,
    is_repeat: bool,
) -> None:
    before = None if previous is None else _record(previous[0], previous[1])
    assert repeated(word, at(tick), before, repeat_after) is is_repeat


def test_the_webhook_body_says_what_happened_with_the_output_s_last_lines_masked() -> None:
    err = "".join(f"line {n}\n" for n in range(30)) + f"posting to {HOOK} failed\n"
    record = _record(
        TickOutcome.FAILED, exit_status=3, stderr=err, stdout="ok\n", duration=1.5, attempts=(3, 3)
    )
    body = webhook_body("report", "failed", record, "chat", [HOOK, PING_URL])
    assert body["job"] == "report" and body["tick"] == "2026-01-01T00:00:00Z"
    assert (body["event"], body["outcome"], body["worker"]) == ("failed", "failed", "w1")
    assert (body["exit_status"], body["attempts"], body["lock_index"]) == (3, [3, 3], 3)
    assert body["notify"] == "chat" and body["output"]["stdout"] == ["ok"]
    stderr = body["output"]["stderr"]
    assert len(stderr) == OUTPUT_LINES and stderr[0] == "line 21"
    assert stderr[-1] == "posting to [masked] failed"
    assert body["text"] == (
        "lockctl: report failed on w1: tick 2026-01-01T00:00:00Z, exit status 3: "
        "posting to [masked] failed"
    )
    assert "SECRET" not in json.dumps(body)


@pytest.mark.parametrize(
    ("event", "outcome", "text"),
    [
        ("missed", TickOutcome.MISSED, "lockctl: report missed tick 2026-01-01T00:00:00Z: nobody"),
        ("lost", TickOutcome.LOST, "lockctl: report lost its lock on w1 during tick"),
        ("recovered", TickOutcome.SUCCEEDED, "lockctl: report recovered on w1: tick 2026"),
        ("failed", TickOutcome.TIMED_OUT, "lockctl: report timed out on w1: tick 2026"),
    ],
)
def test_the_text_line_for_chat_tools(event: str, outcome: TickOutcome, text: str) -> None:
    assert webhook_body("report", event, _record(outcome), "chat")["text"].startswith(text)


def test_output_lines_are_printable_and_bounded() -> None:
    lines = last_lines("a\x1b[31mred\n" + "x" * 2000 + "\n")
    assert lines[0] == "a\\x1b[31mred" and len(lines[1]) < 400


# -- the deliveries of a decided tick ----------------------------------------------------------
def _never_read(keys: JobKeys, tick: datetime) -> TickRecord | None:
    raise AssertionError("read only on the sender's thread, and only for a recovery")


def test_a_failure_pings_fail_and_posts_to_the_blocks_told_of_it() -> None:
    record = _record(TickOutcome.FAILED, 10, exit_status=1)
    made = deliveries(_job(), "failed", record, lambda k, t: None)
    assert [(d.notify, d.method, d.url.reveal()) for d in made] == [
        (PING, "GET", PING_URL + "/fail"),
        ("chat", "POST", HOOK),
    ]
    assert made[1].later is not None  # the previous tick's record is read first: no repeat
    assert made[1].later()[1]["event"] == "failed"  # type: ignore[index]
    assert "SECRET" not in repr(made)  # a delivery's repr names no URL
    quiet = deliveries(
        _job(on=("lost",), ping=False), "failed", _record(TickOutcome.FAILED), _never_read
    )
    assert quiet == []


def test_a_missed_tick_posts_but_does_not_ping_and_may_reveal_a_recovery_already_made() -> None:
    """A replica back from an outage may run a late tick before its housekeeping records the
    ticks before it missed: the success found no record before it, so the one who records
    the miss looks at the tick after it, and tells the recovery if that one succeeded."""
    later = {at(10): _record(TickOutcome.SUCCEEDED, 10, worker="w2")}
    made = deliveries(_job(), "missed", _record(TickOutcome.MISSED), lambda k, t: later.get(t))
    assert [(d.notify, d.event) for d in made] == [("chat", "missed"), ("chat", "recovered")]
    assert made[1].later is not None
    tick, body = made[1].later() or (None, {})
    assert tick == at(10) and (body["event"], body["tick"], body["worker"]) == (
        "recovered",
        "2026-01-01T00:00:10Z",
        "w2",
    )
    none_yet = deliveries(_job(), "missed", _record(TickOutcome.MISSED), lambda k, t: None)
    assert none_yet[1].later is not None and none_yet[1].later() is None


def test_a_success_pings_and_is_a_recovery_only_after_a_tick_that_went_wrong() -> None:
    previous: dict[datetime, TickRecord] = {at(0): _record(TickOutcome.FAILED)}
    reads: list[datetime] = []

    def read(keys: JobKeys, tick: datetime) -> TickRecord | None:
        reads.append(tick)
        return previous.get(tick)

    made = deliveries(_job(), "succeeded", _record(TickOutcome.SUCCEEDED, 10), read)
    assert (made[0].notify, made[0].method, made[0].url.reveal()) == (PING, "GET", PING_URL)
    chat = made[1]
    assert chat.event == "recovered" and chat.body is None and chat.later is not None
    assert chat.later() is not None
    assert reads == [at(0)]
    again = deliveries(_job(), "succeeded", _record(TickOutcome.SUCCEEDED, 20), read)
    assert again[1].later is not None and again[1].later() is None  # tick 10: nothing wrong


def test_a_ping_url_s_fail_goes_before_its_query() -> None:
    assert fail_url(Secret("https://hc.example.net/ping/abc/")).reveal().endswith("/abc/fail")
    assert fail_url(Secret("https://x.example/p?k=1")).reveal() == "https://x.example/p/fail?k=1"


# -- the sender --------------------------------------------------------------------------------
class Said:
    def __init__(self) -> None:
        self.results: list[tuple[str, str, str | None]] = []

    def __call__(self, delivery: Delivery, result: str, error: str | None) -> None:
        self.results.append((delivery.notify, result, error))


def _delivery(notify: str = "chat") -> Delivery:
    return Delivery("report", at(0), notify, "failed", Secret(HOOK), "POST", {"job": "report"})


def _answers(*answers: int | Exception) -> tuple[Callable[[Delivery], int], list[str]]:
    calls: list[str] = []
    left = list(answers)

    def post(delivery: Delivery) -> int:
        calls.append(delivery.notify)
        answer = left.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    return post, calls


def test_a_full_queue_drops_its_oldest_delivery_and_says_so() -> None:
    said = Said()
    sender = Sender(said, post=_answers()[0], capacity=2)  # not started: nothing leaves it
    for name in ("a", "b", "c"):
        sender.submit(_delivery(name))
    assert sender.queued == 2
    assert said.results == [("a", "dropped", "the queue of 2 was full")]


@pytest.mark.parametrize(
    ("answers", "result", "tries", "error"),
    [
        ((200,), "sent", 1, None),
        ((requests.Timeout(f"read timed out: {HOOK}"), 204), "sent", 2, None),
        ((500, 503, 502), "failed", 3, "answered HTTP 502 (3 of 3 tries)"),
        ((429, 200), "sent", 2, None),
        ((404,), "failed", 1, "answered HTTP 404 (1 of 3 tries)"),
        (
            (requests.ConnectionError(f"Max retries exceeded with url: {HOOK}"),) * ATTEMPTS,
            "failed",
            3,
            "cannot connect (3 of 3 tries)",
        ),
        ((requests.Timeout(HOOK),) * ATTEMPTS, "failed", 3, "no answer within 5s (3 of 3 tries)"),
    ],
)
def test_a_delivery_is_tried_a_few_times_and_its_error_never_quotes_the_url(
    answers: tuple[int | Exception, ...], result: str, tries: int, error: str | None
) -> None:
    said = Said()
    post, calls = _answers(*answers)
    Sender(said, post=post, backoff=0.0).deliver(_delivery())
    assert len(calls) == tries
    assert said.results == [("chat", result, error)]


def test_a_success_that_is_no_recovery_is_skipped_unsent() -> None:
    said = Said()
    post, calls = _answers(200)
    sender = Sender(said, post=post, backoff=0.0)
    sender.deliver(replace(_delivery(), body=None, later=lambda: None))
    assert calls == [] and said.results == [("chat", "skipped", None)]


def test_the_thread_sends_in_order_and_a_stop_drains_the_queue() -> None:
    said = Said()
    post, calls = _answers(200, 200)
    sender = Sender(said, post=post)
    sender.submit(_delivery("a"))
    sender.submit(_delivery("b"))
    sender.start()
    sender.close()
    assert calls == ["a", "b"] and [r for _, r, _ in said.results] == ["sent", "sent"]


def test_a_receiver_that_hangs_holds_its_own_lane_only() -> None:
    """Orders, not durations: the `ops` lane's request is still held when `chat` has sent."""
    held, release = threading.Event(), threading.Event()
    said = Said()
    sent = threading.Event()

    def post(delivery: Delivery) -> int:
        if delivery.notify == "ops":
            held.set()
            release.wait()
        return 200

    def heard(delivery: Delivery, result: str, error: str | None) -> None:
        said(delivery, result, error)
        if delivery.notify == "chat":
            sent.set()

    lanes = Lanes(heard, post=post)
    lanes.start()
    lanes.submit(_delivery("ops"))
    assert held.wait(30)
    lanes.submit(_delivery("chat"))
    assert sent.wait(30)
    assert not release.is_set() and said.results == [("chat", "sent", None)]
    release.set()
    lanes.close()
    assert said.results == [("chat", "sent", None), ("ops", "sent", None)]


# -- on the tick core, in virtual time --------------------------------------------------------
class StatusBody:
    """Ends after a second with the status `statuses` gives its tick."""

    def __init__(self, clock: VirtualClock, status: int) -> None:
        self.clock, self.status = clock, status
        self.end: BodyEnd | None = None

    @property
    def ending(self) -> BodyEnd | None:
        return self.end

    def start(self, run: Run, ended: Callable[[], None]) -> None:
        def finish() -> None:
            self.end = BodyEnd(self.status)
            ended()

        self.clock.call_later(1.0, finish)

    def stop(self, how: StopHow) -> None:
        self.end = BodyEnd(-15)
        self.clock.call_later(0.0, lambda: None)


class Queued(Sender):
    """A sender with no thread that takes each delivery's turn at once, as an idle sender
    does: a recovery's read sees the ledger as it is at the completion."""

    def __init__(self) -> None:
        super().__init__(lambda d, r, e: None)
        self.got: list[Delivery] = []

    def submit(self, delivery: Delivery) -> None:
        made = None if delivery.later is None else delivery.later()
        if made is not None:
            delivery = replace(delivery, tick=made[0], body=made[1])
        if delivery.later is None or made is not None:
            self.got.append(delivery)


def _fleet(
    statuses: Callable[[datetime], int],
    workers: tuple[str, ...],
    clock: VirtualClock,
    repeat_after: float | None = None,
) -> tuple[MemoryTickStore, Queued, list[TickCore]]:
    store, sender = MemoryTickStore(clock), Queued()
    notifier = Notifier(sender, lambda keys, tick: store.read_tick(keys, tick)[0])
    notifier.update([_job(repeat_after=repeat_after)])
    job = CoreJob(KEYS, EVERY_10S, TIMINGS, workers)
    cores = [
        TickCore(
            store,
            clock,
            Identity(worker),
            [job],
            lambda name, tick: StatusBody(clock, statuses(tick)),
            notifier,
        )
        for worker in workers
    ]
    return store, sender, cores


def _told(sender: Queued) -> list[tuple[str, str, str]]:
    """(tick, notify, event) of each delivery made, in order."""
    return [(d.tick.strftime("%S"), d.notify, d.event) for d in sender.got]


def test_on_the_core_failures_post_and_the_first_success_after_them_recovers() -> None:
    clock = VirtualClock(START)
    failing = {at(0), at(10)}
    store, sender, cores = _fleet(lambda t: 3 if t in failing else 0, ("w1", "w2"), clock)
    for core in cores:
        core.start()
    clock.advance(45)
    assert _told(sender) == [
        ("00", PING, "failed"),
        ("00", "chat", "failed"),
        ("10", PING, "failed"),  # its chat: a repeat of tick 0's failure, whoever ran either
        ("20", PING, "succeeded"),
        ("20", "chat", "recovered"),  # tick 10 failed: whoever ran tick 20 read so
        ("30", PING, "succeeded"),  # tick 20 succeeded: no recovery
        ("40", PING, "succeeded"),
    ]
    posted = [d for d in sender.got if d.notify == "chat" and d.body is not None]
    assert [d.body["worker"] for d in posted] == [
        store.read_tick(KEYS, d.tick)[0].worker
        for d in posted  # type: ignore[union-attr]
    ]


@pytest.mark.parametrize(
    ("repeat_after", "told_at"),
    [(None, ["00"]), (30.0, ["00", "30", "00"])],  # 00:00:00, :30, 00:01:00
)
def test_on_the_core_a_job_that_fails_every_tick_pages_once_or_once_a_window(
    repeat_after: float | None, told_at: list[str]
) -> None:
    """Two replicas take turns at a job that always fails: the replica that ran a tick reads
    the one before (its own or the other's), so the failure is told once, and again only when
    the block's repeat window turns; the ping says every failure."""
    clock = VirtualClock(START)
    store, sender, cores = _fleet(lambda t: 3, ("w1", "w2"), clock, repeat_after)
    for core in cores:
        core.start()
    clock.advance(65)
    ran_by = {r.worker for r in store.read_ticks(KEYS)}
    assert ran_by == {"w1", "w2"}  # both decided some ticks
    assert [t for t, n, e in _told(sender) if n == "chat"] == told_at
    assert [t for t, n, e in _told(sender) if n == PING] == [
        "00",
        "10",
        "20",
        "30",
        "40",
        "50",
        "00",
    ]


def test_on_the_core_a_tick_nobody_ran_is_missed_once_and_the_late_run_after_it_recovers() -> None:
    clock = VirtualClock(START)
    store, sender, cores = _fleet(lambda t: 0, ("w1", "w2"), clock)
    cores[0].start()
    clock.advance(5)  # tick 0 runs on w1, which then stops
    cores[0].stop()
    clock.advance(30)  # ticks 10, 20 and 30 come with no replica up
    cores[1].start()
    clock.advance(30)
    recorded = [r for r in store.read_ticks(KEYS) if r.outcome is TickOutcome.MISSED]
    missed = [t for t, n, e in _told(sender) if e == "missed"]
    assert len(recorded) >= 2  # a streak of misses: told at its first only
    assert missed == [recorded[0].tick.strftime("%S")]
    assert all(n == "chat" for t, n, e in _told(sender) if e == "missed")  # never a ping
    recoveries = [t for t, n, e in _told(sender) if e == "recovered"]
    first_run = min(r.tick for r in store.read_ticks(KEYS) if r.tick > recorded[-1].tick)
    assert recoveries == [first_run.strftime("%S")]


# -- what the scheduler says and counts --------------------------------------------------------
def test_the_report_says_and_counts_each_result_and_never_the_url() -> None:
    stream = io.StringIO()
    report = CoreReport("w1", stream)
    report.notify_known("report", ["chat", PING])
    report.notified(_delivery("chat"), "sent", None)
    report.notified(_delivery("chat"), "dropped", "the queue of 100 was full")
    report.notified(_delivery(PING), "failed", "answered HTTP 503 (3 of 3 tries)")
    report.notified(_delivery("chat"), "skipped", None)  # a look that found no recovery
    said = [json.loads(line) for line in stream.getvalue().splitlines()]
    assert [(e["event"], e["notify"], e.get("error")) for e in said] == [
        ("notified", "chat", None),
        ("notify-failed", "chat", "the queue of 100 was full"),
        ("notify-failed", PING, "answered HTTP 503 (3 of 3 tries)"),
    ]
    assert all(e["tick"] == "2026-01-01T00:00:00Z" and e["outcome"] == "failed" for e in said)
    counts = {
        (s.labels["notify"], s.labels["result"]): s.value
        for family in report.registry.collect()
        for s in family.samples
        if s.name == "lockctl_notifications_total"
    }
    assert counts == {
        ("chat", "sent"): 1.0,
        ("chat", "failed"): 0.0,
        ("chat", "dropped"): 1.0,
        (PING, "sent"): 0.0,
        (PING, "failed"): 1.0,
        (PING, "dropped"): 0.0,
    }
    assert "SECRET" not in stream.getvalue()
    report.forget("report")
    assert not [
        s for f in report.registry.collect() for s in f.samples if s.labels.get("job") == "report"
    ]


# -- the worker config ---------------------------------------------------------------------------
def test_the_worker_config_carries_the_paths_and_reads_them_back_checked() -> None:
    told = Notifications(
        (
            NotifyTarget("chat", "/etc/lockctl/chat.url", ("failed", "recovered")),
            NotifyTarget("ops", "/etc/lockctl/ops.url", ("failed",), "4h"),
        ),
        "/etc/lockctl/x.ping",
    )
    record = notify_record(told)
    assert record == {
        "notify": {
            "chat": {"url_file": "/etc/lockctl/chat.url", "on": ["failed", "recovered"]},
            "ops": {"url_file": "/etc/lockctl/ops.url", "on": ["failed"], "repeat_after": "4h"},
        },
        "ping_url_file": "/etc/lockctl/x.ping",
    }
    assert told.targets[1].repeat_seconds == 4 * 3600
    assert notify_record(Notifications()) == {}  # a config an older lockctl still reads
    base = {"lock_key": "locks/a/.lock", "ttl": "15s", "lock_delay": "15s"}
    base |= {"renew_interval": "5s", "kill_grace": "5s", "schedule": "@hourly"}
    problems: list[str] = []
    job = read_job("a", {**base, **record}, False, problems)
    assert problems == [] and job is not None and job.notifications == told
    bad = {
        "notify": {
            "chat": {"url_file": HOOK, "on": ["failed"]},
            "ping": {"url_file": "/etc/lockctl/p.url", "on": ["failed"]},
            "ops": {"url_file": "/etc/lockctl/ops.url", "on": ["exploded"]},
            "soon": {"url_file": "/etc/lockctl/s.url", "on": ["failed"], "repeat_after": "0s"},
        },
        "ping_url_file": "relative.url",
    }
    assert read_job("a", {**base, **bad}, False, problems) is None
    assert [p.split(":")[0] for p in problems] == [
        "jobs.a.notify.chat.url_file",
        "jobs.a.notify.ops.on",
        "jobs.a.notify.ping",
        "jobs.a.notify.soon.repeat_after",
        "jobs.a.ping_url_file",
    ]
    assert "SECRET" not in " ".join(problems)


# -- provision.embed's calls: a decorated call's and locker.tick()'s turns -----------------------
def _calls_fleet(
    statuses: Callable[[datetime], int], clock: VirtualClock
) -> tuple[MemoryTickStore, Queued, list[Calls]]:
    """Two replicas' call cores (embed/called.py Calls) on one in-memory Consul, each body
    leaving output ends for the record, as a thread body's are."""
    store, sender = MemoryTickStore(clock), Queued()
    notifier = Notifier(sender, lambda keys, tick: store.read_tick(keys, tick)[0])
    notifier.update([_job()])

    def body_of(turn: CallTurn, held: object) -> StatusBody:
        turn.bodies.append(SimpleNamespace(tails=("exporting\n", f"tick {turn.tick:%S}\n")))
        return StatusBody(clock, statuses(turn.tick))

    made = []
    for worker in ("w1", "w2"):
        calls = Calls(body_of, lambda note: None, notifier)
        job = CoreJob(KEYS, EVERY_10S, TIMINGS, ("w1", "w2"))
        calls.attach(TickCore(store, clock, Identity(worker), [job], calls.body, calls.hear))
        made.append(calls)
    return store, sender, made


def _call_at(calls: Calls, tick: datetime) -> CallTurn:
    config = SimpleNamespace(name=KEYS.name, unit=KEYS.name, lock_key=KEYS.lock_key, key=None)
    turn = CallTurn(config, tick, None, None, lambda note: None)  # type: ignore[arg-type]
    calls.take(turn)
    return turn


def test_embedded_calls_notify_as_the_scheduler_does_from_the_replica_that_ran() -> None:
    """Both replicas call the job at each tick (an app's timer on each); the one that ran it
    tells: failures with the body's output, and the first success after them recovers."""
    clock = VirtualClock(START)
    failing = {at(0), at(10)}
    store, sender, fleet = _calls_fleet(lambda t: 3 if t in failing else 0, clock)
    for seconds in (0, 10, 20, 30):
        clock.advance(seconds - (clock.wall() - START).total_seconds())
        turns = [_call_at(calls, at(seconds)) for calls in fleet]
        clock.advance(5)
        assert all(turn.quiet.is_set() for turn in turns)
    assert _told(sender) == [
        ("00", PING, "failed"),
        ("00", "chat", "failed"),
        ("10", PING, "failed"),
        ("20", PING, "succeeded"),
        ("20", "chat", "recovered"),
        ("30", PING, "succeeded"),
    ]
    failed = [d for d in sender.got if d.notify == "chat" and d.event == "failed"]
    for delivery in failed:
        record = store.read_tick(KEYS, delivery.tick)[0]
        assert record is not None and delivery.body is not None
        assert delivery.body["worker"] == record.worker
        assert delivery.body["output"]["stderr"] == [f"tick {delivery.tick:%S}"]


def test_a_locker_reads_its_jobs_url_files_when_it_is_made(tmp_path: Path) -> None:
    """from_config (and from_env) read every scheduled job's URL files, so a file that cannot
    be used refuses the Locker in one line naming the config, the job and the file."""
    from provision.embed import Locker

    hook = _url_file(tmp_path, HOOK + "\n")
    token = tmp_path / "worker-1.token"
    token.write_text("00000000-0000-0000-0000-000000000001\n")
    token.chmod(0o600)
    job = {"lock_key": "locks/a/.lock", "ttl": "10s", "lock_delay": "4s"}
    job |= {"renew_interval": "1s", "kill_grace": "1s", "schedule": "@every 2s"}
    job |= {"workers": ["worker-1"], "notify": {"chat": {"url_file": str(hook), "on": ["failed"]}}}
    consul = {"address": "http://127.0.0.1:9", "token_file": str(token)}
    config = tmp_path / "lockctl.json"
    config.write_text(
        json.dumps({"format": 1, "worker": "worker-1", "consul": consul, "jobs": {"a": job}})
    )
    locker = Locker.from_config(config)
    try:
        [(notify, on, url, repeat_after)] = locker.notify[0].targets
        assert (notify, on, url.reveal(), repeat_after) == ("chat", ("failed",), HOOK, None)
    finally:
        locker.close()
    hook.chmod(0o644)
    with pytest.raises(InputError) as raised:
        Locker.from_config(config)
    assert str(raised.value) == (
        f"{config}: jobs.a: {hook}: URL file has mode 0644; it holds a secret, so others must "
        f"not read it (chmod 600 {hook})"
    )
