"""provision/consul/quick.py's reading of an HTTP answer: what Consul's agent sends is read
whole (a Content-Length or a chunked body, its Date); anything else is None, so the caller takes
the full path. The reads against a real agent: tests/integration/test_quick_read.py."""

from __future__ import annotations

import io
from datetime import datetime, timezone

import pytest

from provision.consul.quick import MAX_BODY, Answer, read_answer

DATE = b"Date: Sun, 06 Dec 2026 21:40:05 GMT\r\n"


def _read(raw: bytes) -> Answer | None:
    return read_answer(io.BytesIO(raw))


def test_a_body_with_its_length_is_read_with_the_agents_clock() -> None:
    answer = _read(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n" + DATE + b"\r\nhello")
    assert answer is not None
    assert (answer.status, answer.body, answer.keep_alive) == (200, b"hello", True)
    assert answer.date == datetime(2026, 12, 6, 21, 40, 5, tzinfo=timezone.utc)


def test_a_chunked_body_is_joined_and_a_second_answer_follows_on_the_same_stream() -> None:
    stream = io.BytesIO(
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"3\r\nabc\r\n2;ext=1\r\nde\r\n0\r\n\r\n"
        b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n"
    )
    first, second = read_answer(stream), read_answer(stream)
    assert first is not None and first.body == b"abcde" and first.date is None
    assert second is not None and (second.status, second.body) == (404, b"")


@pytest.mark.parametrize(
    ("raw", "keep_alive"),
    [
        (b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 0\r\n\r\n", False),
        (b"HTTP/1.0 200 OK\r\nContent-Length: 0\r\n\r\n", False),
        (b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\n\r\n", False),  # the stream ends
        (b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n", True),
    ],
)
def test_the_connection_is_kept_only_for_a_plain_answer(raw: bytes, keep_alive: bool) -> None:
    answer = _read(raw)
    assert answer is not None and answer.keep_alive is keep_alive


@pytest.mark.parametrize(
    "raw",
    [
        b"",  # the connection closed
        b"HTTP/1.1 200 OK\r\n",  # cut short in the headers
        b"HTTP/1.1 200 OK\r\n\r\nbody",  # no length: read to the end, which this does not
        b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\nshort",
        b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 1\r\n\r\nx",  # said twice
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabcX\r\n0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n",  # no last chunk
        b"HTTP/2 200\r\nContent-Length: 0\r\n\r\n",
        b"SSH-2.0-OpenSSH_9.2\r\n",  # not HTTP at all
        b"HTTP/1.1 200 OK\r\nno colon here\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % (MAX_BODY + 1),
        b"HTTP/1.1 200 OK\r\nX: " + b"y" * 9000 + b"\r\nContent-Length: 0\r\n\r\n",
    ],
)
def test_what_is_not_read_plainly_is_none(raw: bytes) -> None:
    assert _read(raw) is None


@pytest.mark.parametrize(
    "date",
    [b"Sunday, 06-Dec-26 21:40:05 GMT", b"Sun, 06 Dec 2026 21:40:05 +0100", b"Sun, 06 Foo 2026"],
)
def test_a_date_that_is_not_an_imf_fixdate_is_none_and_the_answer_still_read(date: bytes) -> None:
    answer = _read(b"HTTP/1.1 200 OK\r\nDate: " + date + b"\r\nContent-Length: 0\r\n\r\n")
    assert answer is not None and answer.date is None
