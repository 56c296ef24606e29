"""The notifications' queues and threads, apart from the ticks' work: a tick hands a delivery
over and goes on; a receiver that never answers holds its own lane's thread only (`Lanes`:
one queue and thread per notify block's NAME, one for the pings).

Bounded everywhere: each queue holds QUEUE_SIZE deliveries (full: the oldest is dropped, and
said and counted `dropped`); each request waits TIMEOUT at most; a delivery is tried ATTEMPTS
times (again on no answer, a connection refused, a 429 or a 5xx; never on another 4xx), with
BACKOFF doubling between tries. Each delivery's end is handed to `said(delivery, result,
error)`: `sent`, `failed` (the error in words of our own: never the exception's text, which
quotes the URL), `dropped`, or `skipped` (a recovery's look found none).
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

import requests

from provision.ledger.records import tick_name
from provision.system.secrets import Secret
from provision.system.text import printable

QUEUE_SIZE = 100
TIMEOUT = 5.0  # seconds to connect, and again to be answered
ATTEMPTS = 3
BACKOFF = 1.0  # seconds before the second try; doubling
DRAIN = 5.0  # seconds a stop leaves the queue to empty (daemon thread: never waited beyond)
USER_AGENT = "lockctl-notify"

SENT, FAILED, DROPPED, SKIPPED = "sent", "failed", "dropped", "skipped"
RESULTS = (SENT, FAILED, DROPPED)  # the metric's results, at 0 from the start
EVENT_TEXT_LIMIT = 400  # characters of an error in a notify-failed event


Later = tuple[datetime, dict[str, Any]]  # the tick a recovery is of, and its body


@dataclass(frozen=True)
class Delivery:
    """One request to make: a webhook's POST of `body`, or a ping's GET. `notify`: the notify
    block's NAME, or "ping"; `later`: when given, the tick and the body are made by it on the
    sender's thread, and None from it skips the delivery (a recovery, which reads a record
    first)."""

    job: str
    tick: datetime
    notify: str
    event: str
    url: Secret = field(repr=False)
    method: str = "POST"
    body: dict[str, Any] | None = None
    later: Callable[[], Later | None] | None = field(default=None, repr=False, compare=False)


Said = Callable[[Delivery, str, "str | None"], None]
Event = tuple[str, dict[str, Any]]
Post = Callable[[Delivery], int]  # the HTTP status; raises requests' errors


def result_event(delivery: Delivery, result: str, error: str | None) -> Event | None:
    """The event a delivery's end is said as: `notified`, or `notify-failed` with the error
    in lockctl's words (never the URL); None for a recovery's look that found none."""
    if result not in RESULTS:
        return None
    fields: dict[str, Any] = {
        "tick": tick_name(delivery.tick),
        "notify": delivery.notify,
        "outcome": delivery.event,
    }
    if result == SENT:
        return "notified", fields
    return "notify-failed", {**fields, "error": printable(error or result, EVENT_TEXT_LIMIT)}


class Sender:
    """The queue and its thread (`start`, `submit`, `close`); `deliver` is one delivery's
    tries, callable alone (the tests')."""

    def __init__(
        self,
        said: Said,
        *,
        post: Post | None = None,
        capacity: int = QUEUE_SIZE,
        backoff: float = BACKOFF,
    ) -> None:
        self.said, self.capacity, self.backoff = said, capacity, backoff
        self.post = post or _Http().post
        self._queue: collections.deque[Delivery] = collections.deque()
        self._changed = threading.Condition()
        self._closing = threading.Event()  # no more tries
        self._draining = False  # a stop: the thread ends once the queue is empty
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="lockctl-notify", daemon=True)
        self._thread.start()

    def submit(self, delivery: Delivery) -> None:
        """Queue it; never waits (the core's thread calls this). Full: the oldest goes."""
        dropped = None
        with self._changed:
            if len(self._queue) >= self.capacity:
                dropped = self._queue.popleft()
            self._queue.append(delivery)
            self._changed.notify()
        if dropped is not None:
            self.said(dropped, DROPPED, f"the queue of {self.capacity} was full")

    @property
    def queued(self) -> int:
        with self._changed:
            return len(self._queue)

    def drain(self) -> None:
        """The thread ends once the queue is empty."""
        with self._changed:
            self._draining = True
            self._changed.notify()

    def close(self, drain: float = DRAIN) -> None:
        """No more tries after `drain` seconds (a receiver that hangs keeps the thread, a
        daemon, until its timeout; nobody waits for it)."""
        self.drain()
        if self._thread is not None:
            self._thread.join(drain)
        self._closing.set()

    def _run(self) -> None:
        while not self._closing.is_set():
            with self._changed:
                while not self._queue and not self._draining:
                    self._changed.wait()
                if not self._queue:
                    return
                delivery = self._queue.popleft()
            try:
                self.deliver(delivery)
            except Exception as exc:  # a bug: said, and the lane goes on with the next
                self.said(delivery, FAILED, f"unexpected {type(exc).__name__}")

    def deliver(self, delivery: Delivery) -> None:
        """Its tries, then its result said."""
        if delivery.later is not None:
            try:
                made = delivery.later()
            except Exception as exc:  # the record's read failed: no recovery known
                self.said(delivery, FAILED, f"cannot tell a recovery: {type(exc).__name__}")
                return
            if made is None:
                self.said(delivery, SKIPPED, None)
                return
            delivery = replace(delivery, tick=made[0], body=made[1], later=None)
        error, tries = "not tried", 0
        for attempt in range(ATTEMPTS):
            if attempt and self._closing.wait(self.backoff * 2 ** (attempt - 1)):
                break
            failed, again = self._try(delivery)
            tries += 1
            if failed is None:
                self.said(delivery, SENT, None)
                return
            error = failed
            if not again:
                break
        self.said(delivery, FAILED, f"{error} ({tries} of {ATTEMPTS} tries)")

    def _try(self, delivery: Delivery) -> tuple[str | None, bool]:
        """One request: (None, _) when answered 2xx, else (the error in words, retry?)."""
        try:
            status = self.post(delivery)
        except requests.Timeout:
            return f"no answer within {TIMEOUT:g}s", True
        except requests.ConnectionError:
            return "cannot connect", True
        except requests.RequestException as exc:
            return f"request failed ({type(exc).__name__})", False
        if 200 <= status < 300:
            return None, False
        return f"answered HTTP {status}", status == 429 or status >= 500


class _Http:
    """requests, with a session of its own: no redirect followed (a redirect elsewhere would
    carry the body away)."""

    def __init__(self) -> None:
        self.session = requests.Session()
        self.session.headers["User-Agent"] = USER_AGENT

    def post(self, delivery: Delivery) -> int:
        answer = self.session.request(
            delivery.method,
            delivery.url.reveal(),
            json=delivery.body,
            timeout=(TIMEOUT, TIMEOUT),
            allow_redirects=False,
        )
        answer.close()
        return answer.status_code


class Lanes:
    """One Sender per notify block's NAME (and one for the pings), made at its first delivery:
    a receiver that hangs holds its own lane only, never another block's or the pings'."""

    def __init__(self, said: Said, *, post: Post | None = None) -> None:
        self.said, self.post = said, post
        self._lanes: dict[str, Sender] = {}
        self._lock = threading.Lock()
        self._started = False

    def start(self) -> None:
        with self._lock:
            self._started = True
            for lane in self._lanes.values():
                lane.start()

    def submit(self, delivery: Delivery) -> None:
        with self._lock:
            lane = self._lanes.get(delivery.notify)
            if lane is None:
                lane = self._lanes[delivery.notify] = Sender(self.said, post=self.post)
                if self._started:
                    lane.start()
        lane.submit(delivery)

    def close(self, drain: float = DRAIN) -> None:
        """Every lane drained for `drain` seconds at most, together."""
        with self._lock:
            lanes = list(self._lanes.values())
        for lane in lanes:
            lane.drain()
        deadline = time.monotonic() + drain
        for lane in lanes:
            lane.close(max(0.0, deadline - time.monotonic()))
