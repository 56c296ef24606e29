"""Why a job's PID namespace was refused, as the runner tells it (runner/containment.py,
child.py): the step the namespace helper's init names, else unshare's own words, else its exit
status; the init's first line read whole however it arrives; each reason said once a process."""

from __future__ import annotations

import socket

import pytest

from provision.runner import containment
from provision.runner.child import _init_answer
from provision.runner.containment import first_telling, refusal_reason

REASONS = [
    # (what the init said on the control socket, unshare's stderr, its exit status) -> reason
    (
        b"refused mount /proc: Operation not permitted\n",
        b"",
        125,
        "mount /proc: Operation not permitted",
    ),
    (
        b"refused unshare of a user, PID and mount namespace: Operation not permitted\n",
        b"",
        125,
        "unshare of a user, PID and mount namespace: Operation not permitted",
    ),
    (
        b"",
        b"unshare: mount /proc failed: Operation not permitted\n",
        1,
        "unshare: mount /proc failed: Operation not permitted",
    ),
    (
        b"",
        b"unshare: unshare failed: Operation not permitted\n\n",
        1,
        "unshare: unshare failed: Operation not permitted",
    ),
    # a Python that could not start the init: its error is the traceback's last line
    (
        b"",
        b"Traceback (most recent call last):\n  File ...\nImportError: no json\n",
        1,
        "ImportError: no json",
    ),
    (b"", b"", 127, "the job's namespace ended before its init was ready (exit 127)"),
    (b"", b"", -9, "the job's namespace ended before its init was ready (exit -9)"),
    # the init's word wins over whatever else was written; control characters are shown, not sent
    (
        b"refused mount /proc: \x1b[2JPermission denied\n",
        b"noise\n",
        125,
        "mount /proc: \\x1b[2JPermission denied",
    ),
    # not a refusal the init said (a partial `ready`): unshare's words, or the status
    (b"rea", b"", 125, "the job's namespace ended before its init was ready (exit 125)"),
]


@pytest.mark.parametrize(("init_said", "unshare_said", "code", "reason"), REASONS)
def test_the_reason_names_what_refused_the_namespace(
    init_said: bytes, unshare_said: bytes, code: int, reason: str
) -> None:
    assert refusal_reason(init_said, unshare_said, code) == reason


def test_an_overlong_reason_is_cut() -> None:
    reason = refusal_reason(b"", b"unshare: " + b"x" * 5000 + b"\n", 1)
    assert reason.startswith("unshare: xxx") and len(reason) <= 200


def test_each_reason_is_told_once_a_process(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(containment, "_told", set())
    told = [
        first_telling(reason)
        for reason in ("mount /proc: EPERM", "mount /proc: EPERM", "other", "other")
    ]
    assert told == [True, False, True, False]


@pytest.mark.parametrize(
    ("chunks", "answer"),
    [
        ([b"ready\n"], b"ready\n"),
        ([b"rea", b"dy\n"], b"ready\n"),  # a stream: one word may come in pieces
        (
            [b"refused mount /proc: ", b"Operation not permitted\n"],
            b"refused mount /proc: Operation not permitted\n",
        ),
        ([], b""),  # ended without a word: unshare failed before the init started
        ([b"refused without its end of line"], b"refused without its end of line"),
        ([b"x" * 5000], b"x" * 1024),  # bounded: a stranger's flood is not read to its end
    ],
)
def test_the_inits_first_line_is_read_whole(chunks: list[bytes], answer: bytes) -> None:
    ours, theirs = socket.socketpair()
    with ours, theirs:
        for chunk in chunks:
            theirs.sendall(chunk)
        if not answer.endswith(b"\n"):
            theirs.shutdown(socket.SHUT_WR)  # the init ended
        ours.settimeout(5)
        assert _init_answer(ours) == answer
