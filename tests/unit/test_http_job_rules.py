"""HTTP jobs without a cluster: the spec's `http` block refused at FILE:LINE (bad URLs,
credentials in the URL, both a command and http, methods, timeouts), the worker config's
round trip, and the call itself against a real local http.server (headers, outcomes, abort)."""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Iterator
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import pytest

from provision.cli.runjob import RunArgs, _check_command
from provision.errors import InputError
from provision.runner.http_job import HttpJob, request_headers
from provision.spec import SpecError, parse_spec
from provision.system.http_call import HttpCall, url_problem
from provision.timings import JobTimings
from provision.workers.config import JobConfig
from provision.workers.job_config import job_record, read_job

HEAD = """worker "w1" {
  address = "http://127.0.0.1:8500"
}
job "a" {
  prefix   = "locks/a/"
  workers  = ["w1"]
  schedule = "@every 1m"
"""


def _spec(body: str) -> str:
    return HEAD + body + "}\n"


def _problems(body: str) -> list[str]:
    with pytest.raises(SpecError) as caught:
        parse_spec(_spec(body), "locks.hcl")
    return [str(problem) for problem in caught.value.problems]


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("ftp://127.0.0.1:21/x", "must start with http:// or https://"),
        ("127.0.0.1:8080/x", "must start with http:// or https://"),
        ("http://127.0.0.1/x", "must name a port"),
        ("http://127.0.0.1:99999/x", "valid port"),
        ("http://user:secret@127.0.0.1:8080/x", "must not carry credentials (user:password@)"),
        ("http://token@127.0.0.1:8080/x", "must not carry credentials (user:password@)"),
        ("http://127.0.0.1:8080/x?token=abc", "credentials in its query string"),
        ("http://127.0.0.1:8080/x?api_key=abc", "credentials in its query string"),
        ("http://127.0.0.1:8080/x?X-Amz-Signature=1", "credentials in its query string"),
        ("http://127.0.0.1:8080/x#frag", "must not have a #fragment"),
        ("http://bad_host:8080/x", "must name a host"),
        ("http://:8080/x", "must name a host"),
        ("http://127.0.0.1:8080/a b", "without spaces"),
        ("http://127.0.0.1:8080/\x1b[2J", "printable"),
        ("http://127.0.0.1:8080/" + "a" * 3000, "at most 2048"),
    ],
)  # fmt: skip
def test_a_bad_url_is_refused_at_its_line_without_echoing_it(url: str, says: str) -> None:
    problems = _problems(f'  http {{\n    url = "{url}"\n    timeout = "5s"\n  }}\n')
    assert len(problems) == 1 and problems[0].startswith('locks.hcl:9: job "a".http.url: ')
    assert says in problems[0], problems
    assert "secret" not in problems[0] and "abc" not in problems[0]  # never echoed


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:8080/jobs/refresh",
        "https://app.internal:8443/",
        "http://[::1]:8080/x",
        "http://localhost:8080",
        "http://127.0.0.1:8080/x?region=eu&dry_run=0",
    ],
)
def test_a_good_url_passes(url: str) -> None:
    assert url_problem(url) is None


@pytest.mark.parametrize(
    ("body", "line", "where", "says"),
    [
        (
            '  command = ["/bin/true"]\n  http {\n    url = "http://127.0.0.1:8080/x"\n'
            '    timeout = "5s"\n  }\n',
            8, "job \"a\".command", "a command or an http block, not both",
        ),
        (
            '  timeout = "5s"\n  http {\n    url = "http://127.0.0.1:8080/x"\n  }\n',
            8, "job \"a\".timeout", "sets its timeout in http.timeout",
        ),
        (
            '  http {\n    url = "http://127.0.0.1:8080/x"\n    method = "FETCH"\n  }\n',
            10, "job \"a\".http.method", "must be one of POST, PUT, GET, PATCH, DELETE",
        ),
        (
            '  http {\n    url = "http://127.0.0.1:8080/x"\n    timeout = "2m"\n  }\n',
            10, "job \"a\".http.timeout", "2m must be below the schedule's interval (60s)",
        ),
        (
            '  http {\n    url = "http://127.0.0.1:8080/x"\n    timeout = "0s"\n  }\n',
            10, "job \"a\".http.timeout", "must be between 1s and 86400s",
        ),
        (
            '  http {\n    url = "http://127.0.0.1:8080/x"\n    timeout = "soon"\n  }\n',
            10, "job \"a\".http.timeout", "is not a duration",
        ),
        ('  http {\n    method = "POST"\n  }\n', 8, "job \"a\".http.url", "is required"),
        (
            '  http {\n    url = "http://127.0.0.1:8080/x"\n    headers = "x"\n  }\n',
            10, "job \"a\".http.headers", "unknown; expected url, method, timeout",
        ),
        (
            '  http {\n    url = "http://127.0.0.1:8080/x"\n    timeout = "5s"\n  }\n'
            '  http {\n    url = "http://127.0.0.1:8080/y"\n  }\n',
            12, "job \"a\".http", "set twice; the first is on line 8",
        ),
    ],
)  # fmt: skip
def test_an_unusable_http_block_is_refused_at_its_line(
    body: str, line: int, where: str, says: str
) -> None:
    problems = _problems(body)
    assert any(p.startswith(f"locks.hcl:{line}: {where}: ") and says in p for p in problems), (
        problems
    )


def test_the_default_timeout_is_named_when_it_does_not_fit() -> None:
    text = _spec('  http {\n    url = "http://127.0.0.1:8080/x"\n  }\n').replace("1m", "20s")
    with pytest.raises(SpecError) as caught:
        parse_spec(text, "locks.hcl")
    assert [str(problem) for problem in caught.value.problems] == [
        'locks.hcl:8: job "a".http.timeout: 30s (the default) must be below the '
        "schedule's interval (20s)"
    ]


def test_an_http_job_goes_into_the_worker_config_and_back() -> None:
    spec = parse_spec(
        _spec('  http {\n    url = "http://127.0.0.1:8080/x"\n    method = "PUT"\n'
              '    timeout = "20s"\n  }\n'),
        "locks.hcl",
    )  # fmt: skip
    job = spec.jobs[0]
    assert job.http == HttpCall("http://127.0.0.1:8080/x", "PUT", 20.0) and job.command is None
    assert job.timings.timeout == 20.0  # the request's timeout is the job's
    record = job_record(job)
    assert record["http"] == {"url": "http://127.0.0.1:8080/x", "method": "PUT"}
    problems: list[str] = []
    read = read_job("a", record, False, problems)
    assert problems == [] and read is not None and read.http == job.http


@pytest.mark.parametrize(
    ("change", "says"),
    [
        ({"url": "http://u:p@127.0.0.1:1/"}, "jobs.a.http: must not carry credentials"),
        ({"method": "TRACE"}, "jobs.a.http: must be one of"),
        ({"extra": 1}, 'jobs.a.http: must be {"url"'),
    ],
)
def test_the_worker_config_checks_the_call_as_the_spec_does(
    change: dict[str, Any], says: str
) -> None:
    spec = parse_spec(
        _spec('  http {\n    url = "http://127.0.0.1:8080/x"\n    timeout = "5s"\n  }\n'),
        "locks.hcl",
    )
    record = job_record(spec.jobs[0])
    record["http"] = {**record["http"], **change}
    problems: list[str] = []
    assert read_job("a", record, False, problems) is None
    assert any(p.startswith(says) for p in problems), problems


# --- the call, against a real local server ---------------------------------------------------


class _App(BaseHTTPRequestHandler):
    seen: ClassVar[list[dict[str, str]]] = []

    def do_POST(self) -> None:
        _App.seen.append(dict(self.headers))
        if self.path == "/hang":
            time.sleep(5)  # until the test's abort closes the connection
            return
        status = {"/ok": 204, "/fail": 503}.get(self.path, 404)
        self.send_response(status)
        body = b"\x1b[31mred\x1b[0m" if status != 204 else b""
        if body:
            self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def app() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _App)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    _App.seen = []
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


LOCK_ENV = {
    "LOCKCTL_TICK": "2026-12-04T22:00:00Z",
    "LOCK_INDEX": "42",
    "LOCK_KEY": "locks/a/.lock",
    "LOCK_SESSION": "not-sent",
    "LOCKCTL_JOB": "a",
    "LOCKCTL_WORKER": "w1",
}


def _run(url: str, timeout: float = 5.0) -> HttpJob:
    job = HttpJob(HttpCall(url, "POST", timeout), secrets=["s3cr3t-token-value"])
    job.start(LOCK_ENV)
    job.wait()
    return job


def test_the_headers_say_the_tick_the_token_and_the_deadline() -> None:
    now = datetime(2026, 12, 4, 22, 0, 1, tzinfo=timezone.utc)
    headers = request_headers(LOCK_ENV, 30.0, now)
    assert headers["X-Lockctl-Tick"] == "2026-12-04T22:00:00Z"
    assert headers["X-Lockctl-Lock-Index"] == "42"
    assert headers["X-Lockctl-Deadline"] == "2026-12-04T22:00:31.000Z"
    assert headers["X-Lockctl-Job"] == "a" and headers["X-Lockctl-Worker"] == "w1"
    assert "not-sent" not in headers.values()  # the session is not the app's business


def test_a_2xx_succeeds_and_the_app_gets_only_lockctls_headers(app: str) -> None:
    job = _run(f"{app}/ok")
    assert job.exit_status == 0 and job.output_tails() == (None, "HTTP 204 No Content")
    assert not job.tree_alive()
    sent = _App.seen[0]
    assert sent["X-Lockctl-Lock-Index"] == "42"
    assert not {"Authorization", "X-Consul-Token", "Cookie"} & set(sent)


def test_another_status_fails_with_it_and_a_printable_body(app: str) -> None:
    job = _run(f"{app}/fail")
    assert job.exit_status == 1
    assert job.output_tails() == ("\\x1b[31mred\\x1b[0m", "HTTP 503 Service Unavailable")


def test_an_app_that_is_down_fails_with_the_connection_error() -> None:
    job = _run("http://127.0.0.1:9/x")  # the discard port: nobody listens
    assert job.exit_status == 1
    reason = job.output_tails()[1]
    assert reason is not None and reason.startswith("no answer: ") and "refused" in reason


def test_an_abort_ends_the_call_at_once_as_a_signal_would(app: str) -> None:
    job = HttpJob(HttpCall(f"{app}/hang", "POST", 30.0))
    job.start(LOCK_ENV)
    deadline = time.monotonic() + 5
    while not _App.seen and time.monotonic() < deadline:
        time.sleep(0.01)
    assert job.tree_alive() and job.exit_status is None
    assert job.signal_tree(signal.SIGTERM) is True
    assert job.exit_status == 128 + signal.SIGTERM and not job.tree_alive()
    assert job.output_tails()[1] == "aborted: the request was cut off by lockctl"
    assert job.signal_tree(signal.SIGKILL) is False  # nothing left to stop
    job.close()


def test_run_wants_a_command_except_for_an_http_job() -> None:
    timings = JobTimings(15.0, 15.0, 5.0, 5.0, 0.0, 300.0, 0.0, 5.0)
    plain = JobConfig("a", "locks/a/.lock", timings, None)
    http = JobConfig("a", "locks/a/.lock", timings, None, http=HttpCall("http://h:1/", "POST", 5))

    def args(*command: str) -> RunArgs:
        return RunArgs(list(command), "a", Path("w.json"))

    _check_command(args("/bin/true"), plain)
    _check_command(args(), http)
    for argv, job, says in (
        ((), plain, "run: no command: put the job's command after --"),
        (("/bin/true",), http, "run: job a is an HTTP job (it calls its app): give it no command"),
    ):
        with pytest.raises(InputError) as caught:
            _check_command(args(*argv), job)
        assert str(caught.value).startswith(says), caught.value
