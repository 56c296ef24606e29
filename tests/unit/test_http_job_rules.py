"""HTTP jobs without a cluster: the spec's `http` block refused at FILE:LINE (bad URLs,
credentials in the URL, both a command and http, methods, timeouts), the worker config's
round trip, and the call itself against a real local http.server (headers, outcomes, abort)."""

from __future__ import annotations

import json
import re
import signal
import threading
import time
from collections.abc import Iterator
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import pytest
import typer
from typer.testing import CliRunner

from provision.acl.lint import target_findings
from provision.cli import policies
from provision.cli.app import ErrorBoundaryGroup
from provision.cli.runjob import RunArgs, _check_command
from provision.errors import InputError
from provision.ledger.records import parse_tick_name
from provision.outcomes import Outcome
from provision.runner.core_body import idempotency_key
from provision.runner.http_job import HttpJob, request_headers
from provision.spec import SpecError, parse_spec
from provision.system.http_call import (
    RETRY_ON_TIMEOUT_REFUSED,
    HttpCall,
    Target,
    judge_target,
    url_problem,
)
from provision.tick.retries import Retry, Stop, StopReason, next_attempt
from provision.timings import JobTimings
from provision.workers.config import ConfigError, JobConfig, config_record, load_worker_config
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


# --- issue: HTTP attempts never overlap --------------------------------------------------------

HTTP_BLOCK = '  http {\n    url = "http://127.0.0.1:8080/x"\n    timeout = "5s"\n  }\n'
ON_TIMEOUT = JobTimings(15, 15, 5, 5, retries=2, retry_delay=1, retry_on_timeout=True)
RETRIES = JobTimings(15, 15, 5, 5, retries=2, retry_delay=1)
RAN, LOST, TIMED_OUT = Outcome.RAN, Outcome.LOST, Outcome.TIMED_OUT


@pytest.mark.parametrize(
    ("verdict", "status", "attempt", "timings", "http", "expected"),
    [
        # a timed-out call is never retried, whatever the timings say (its handler may run on)
        (TIMED_OUT, 143, 1, ON_TIMEOUT, True, Stop(StopReason.NOT_RETRIED)),
        (TIMED_OUT, 0, 1, ON_TIMEOUT, True, Stop(StopReason.NOT_RETRIED)),
        (TIMED_OUT, 143, 1, ON_TIMEOUT, False, Retry(2, 101.0)),  # a command's tree is killed
        # an answer that is not 2xx, or a refused connection (both exit 1): retried
        (RAN, 1, 1, RETRIES, True, Retry(2, 101.0)),
        (RAN, 1, 2, ON_TIMEOUT, True, Retry(3, 101.0)),
        (RAN, 1, 3, RETRIES, True, Stop(StopReason.EXHAUSTED)),
        (RAN, 0, 1, RETRIES, True, Stop(StopReason.SUCCEEDED)),
        # a lost lock during the request: no further attempt is sent
        (LOST, 143, 1, RETRIES, True, Stop(StopReason.NOT_RETRIED)),
        (LOST, None, 1, ON_TIMEOUT, True, Stop(StopReason.NOT_RETRIED)),
        (Outcome.INTERRUPTED, 143, 1, RETRIES, True, Stop(StopReason.NOT_RETRIED)),
    ],
)
def test_the_retry_decision_never_retries_a_timed_out_http_call(
    verdict: Outcome,
    status: int | None,
    attempt: int,
    timings: JobTimings,
    http: bool,
    expected: Retry | Stop,
) -> None:
    assert next_attempt(verdict, status, attempt, timings, 100.0, None, http=http) == expected


@pytest.mark.parametrize(
    ("defaults", "own", "line", "where", "says"),
    [
        ("", "  retries = 2\n  retry_on_timeout = true\n", 11, 'job "a".retry_on_timeout',
         "true is refused for an HTTP job: an HTTP handler cannot be stopped"),
        ("  retry_on_timeout = true\n", "  retries = 2\n", 7, 'job "a"',
         "inherits retry_on_timeout = true from defaults, which is refused for an HTTP job "
         "(set retry_on_timeout = false in it): an HTTP handler cannot be stopped"),
        ("  retries = 2\n  retry_on_timeout = true\n", "", 8, 'job "a"',
         "inherits retry_on_timeout = true from defaults"),
    ],
)  # fmt: skip
def test_retry_on_timeout_is_refused_for_an_http_job(
    defaults: str, own: str, line: int, where: str, says: str
) -> None:
    text = "defaults {\n" + defaults + "}\n" + _spec(own + HTTP_BLOCK)
    with pytest.raises(SpecError) as caught:
        parse_spec(text, "locks.hcl")
    problems = [str(problem) for problem in caught.value.problems]
    assert len(problems) == 1 and problems[0].startswith(f"locks.hcl:{line}: {where}: "), problems
    assert says in problems[0] and "Idempotency-Key header, or use a command job" in problems[0]


def test_an_http_job_may_retry_answers_and_turn_off_an_inherited_retry_on_timeout() -> None:
    own = "  retries = 2\n  retry_on_timeout = false\n"
    text = "defaults {\n  retry_on_timeout = true\n}\n" + _spec(own + HTTP_BLOCK)
    job = parse_spec(text, "locks.hcl").jobs[0]
    assert job.timings.retries == 2 and job.timings.retry_on_timeout is False
    record = job_record(job)
    assert record["retries"] == 2 and record["retry_on_timeout"] is False


def test_the_worker_config_refuses_retry_on_timeout_beside_http(tmp_path: Path) -> None:
    spec = parse_spec(_spec("  retries = 2\n" + HTTP_BLOCK), "locks.hcl")
    record = config_record(spec, "w1", Path("/t"))
    record["jobs"]["a"]["retry_on_timeout"] = True  # hand-edited, or from an older lockctl
    path = tmp_path / "lockctl.json"
    path.write_text(json.dumps(record))
    with pytest.raises(ConfigError) as caught:
        load_worker_config(path)
    assert str(caught.value) == (
        f"{path}: jobs.a.retry_on_timeout: true is refused for a job with http: "
        + RETRY_ON_TIMEOUT_REFUSED
    )
    record["jobs"]["a"]["retry_on_timeout"] = False
    path.write_text(json.dumps(record))
    assert load_worker_config(path).job("a").timings.retries == 2


HASH = "sha256-[0-9a-f]{32}"


@pytest.mark.parametrize(
    ("job", "tick", "trigger", "index", "key"),
    [
        ("report", "2026-12-04T22:00:00Z", None, 9, "lockctl:report:2026-12-04T22:00:00Z"),
        ("report", "2026-12-04T22:00:05Z", None, 9, "lockctl:report:2026-12-04T22:00:05Z"),
        ("report", "2026-12-04T22:00:01.250Z", "1f2e3d4c5b6a7980", 9,
         "lockctl:report:2026-12-04T22:00:01.250Z:trigger:1f2e3d4c5b6a7980"),
        ("report", None, None, 1234, "lockctl:report:lock:1234"),
        ("report", None, None, 1240, "lockctl:report:lock:1240"),
        # a trigger note not written by lockctl, a hand-edited job name: hashed, still printable
        ("report", "2026-12-04T22:00:01.250Z", 'a "b"\\', 9,
         f"lockctl:report:2026-12-04T22:00:01.250Z:trigger:{HASH}"),
        ("ré port", None, None, 1, f"lockctl:{HASH}:lock:1"),
        ("a:b", "2026-12-04T22:00:00Z", None, 1, f"lockctl:{HASH}:2026-12-04T22:00:00Z"),
    ],
)  # fmt: skip
def test_the_idempotency_key_names_the_run(
    job: str, tick: str | None, trigger: str | None, index: int, key: str
) -> None:
    at = None if tick is None else parse_tick_name(tick)
    made = idempotency_key(job, at, trigger, index)
    assert re.fullmatch(key, made), made
    assert made.isascii() and made.isprintable() and len(made) <= 170
    assert '"' not in made and "\\" not in made and " " not in made
    assert made == idempotency_key(job, at, trigger, index)  # deterministic


def test_a_keyed_runs_idempotency_key_names_its_key() -> None:
    tick = parse_tick_name("2026-12-04T22:00:00Z")
    one = idempotency_key("report", tick, None, 0, "tenant-1")
    two = idempotency_key("report", tick, None, 0, "tenant-2")
    assert one == "lockctl:report:key:tenant-1:2026-12-04T22:00:00Z"
    assert len({one, two, idempotency_key("report", tick, None, 0)}) == 3  # each key's own
    longest = idempotency_key("j" * 64, tick, "t" * 64, 0, "k" * 128)  # a long key: hashed
    assert re.fullmatch(f"lockctl:j{{64}}:key:{HASH}:2026-12-04T22:00:00Z:trigger:t{{64}}", longest)
    assert len(longest) <= 240


def test_keys_differ_between_runs_and_are_bounded() -> None:
    tick = parse_tick_name("2026-12-04T22:00:00Z")
    later = parse_tick_name("2026-12-04T22:00:05Z")
    manual = parse_tick_name("2026-12-04T22:00:00.001Z")
    keys = {
        idempotency_key("a", tick, None, 1),
        idempotency_key("a", later, None, 1),
        idempotency_key("b", tick, None, 1),
        idempotency_key("a", manual, "t1", 1),
        idempotency_key("a", manual, "t2", 1),
        idempotency_key("a", None, None, 1),
        idempotency_key("a", None, None, 2),
    }
    assert len(keys) == 7
    longest = idempotency_key("j" * 64, manual, "t" * 64, 2**63)
    assert len(longest) <= 170, len(longest)


def test_the_headers_say_the_attempt_and_the_runs_idempotency_key() -> None:
    env = {**LOCK_ENV, "LOCKCTL_ATTEMPT": "2", "LOCKCTL_IDEMPOTENCY_KEY": "lockctl:a:t"}
    headers = request_headers(env, 30.0)
    assert headers["X-Lockctl-Attempt"] == "2"
    assert headers["Idempotency-Key"] == '"lockctl:a:t"'  # a Structured Field string
    assert "Idempotency-Key" not in request_headers(LOCK_ENV, 30.0)


def test_the_app_gets_the_attempt_and_the_key(app: str) -> None:
    env = {**LOCK_ENV, "LOCKCTL_ATTEMPT": "3", "LOCKCTL_IDEMPOTENCY_KEY": "lockctl:a:t"}
    job = HttpJob(HttpCall(f"{app}/ok", "POST", 5.0))
    job.start(env)
    assert job.wait() == 0
    assert _App.seen[0]["X-Lockctl-Attempt"] == "3"
    assert _App.seen[0]["Idempotency-Key"] == '"lockctl:a:t"'


# --- issue: lint and the spec judge HTTP targets by what the URL says --------------------------


@pytest.mark.parametrize(
    ("url", "target"),
    [
        ("http://127.0.0.1:8080/x", Target.LOCAL),
        ("http://127.3.2.1:8080/x", Target.LOCAL),
        ("http://localhost:8080/x", Target.LOCAL),
        ("http://LocalHost.:8080/x", Target.LOCAL),
        ("http://[::1]:8080/x", Target.LOCAL),
        ("http://[::ffff:127.0.0.1]:8080/x", Target.LOCAL),
        ("http://0x7f.1:8080/x", Target.LOCAL),  # inet_aton's forms: never a DNS name
        ("http://app.internal:8443/", Target.REMOTE),
        ("https://api.example.com:443/hook", Target.REMOTE),
        ("http://10.0.0.5:8080/x", Target.REMOTE),
        ("http://0.0.0.0:8080/x", Target.REMOTE),
        ("http://[2001:db8::1]:8080/x", Target.REMOTE),
        ("http://localhost.example.com:80/", Target.REMOTE),
        ("http://foo.localhost:80/", Target.REMOTE),
        ("http://0127.0.0.1:80/", Target.REMOTE),  # octal: 87.0.0.1, as inet_aton reads it
        ("http://169.254.169.254:80/latest/meta-data/", Target.METADATA),
        ("http://169.254.170.2:80/v2/credentials", Target.METADATA),
        ("http://[fe80::1]:80/", Target.METADATA),
        ("http://[fe80::1%25eth0]:80/", Target.METADATA),
        ("http://[fd00:ec2::254]:80/", Target.METADATA),
        ("http://[::ffff:169.254.169.254]:80/", Target.METADATA),
        ("http://2852039166:80/", Target.METADATA),  # 169.254.169.254 as one number
        ("http://0xa9fea9fe:80/", Target.METADATA),
        ("http://0251.0376.0251.0376:80/", Target.METADATA),
        ("http://169.254.43518:80/", Target.METADATA),
        ("http://100.100.100.200:80/", Target.METADATA),
        ("http://metadata.google.internal:80/", Target.METADATA),
        ("http://Metadata.Google.Internal.:80/", Target.METADATA),
        ("http://metadata:80/", Target.METADATA),
        ("http://metadata.azure.com:80/", Target.METADATA),
        ("http://instance-data:80/", Target.METADATA),
        ("http://metadata.example.com:80/", Target.REMOTE),
    ],
)
def test_the_target_is_judged_by_what_the_url_says(url: str, target: Target) -> None:
    assert url_problem(url) is None  # each is a URL the spec accepts as such
    assert judge_target(url) is target


def _http_spec(url: str, extra: str = "") -> str:
    return _spec(f'{extra}  http {{\n    url = "{url}"\n    timeout = "5s"\n  }}\n')


@pytest.mark.parametrize(
    "url",
    [
        "http://169.254.169.254:80/latest/meta-data/iam/security-credentials/",
        "http://metadata.google.internal:80/computeMetadata/v1/",
        "http://[fd00:ec2::254]:80/",
        "http://2852039166:80/",
    ],
)
def test_a_metadata_target_is_a_spec_error_at_the_urls_line(url: str) -> None:
    problems = _problems(f'  http {{\n    url = "{url}"\n    timeout = "5s"\n  }}\n')
    assert problems == [
        'locks.hcl:9: job "a".http.url: names a link-local or cloud metadata target: the '
        "answer's first 2 KB would go into the tick record, which every reader of the job's "
        "prefix can read; call the app on 127.0.0.1 or localhost, or set allow_remote_target "
        "= true on the job if this target is meant"
    ]
    job = parse_spec(_http_spec(url, "  allow_remote_target = true\n"), "locks.hcl").jobs[0]
    assert job.allow_remote_target and job.http is not None and job.http.url == url


@pytest.mark.parametrize(
    ("body", "line", "says"),
    [
        ('  command = ["/bin/true"]\n  allow_remote_target = true\n', 9,
         'job "a".allow_remote_target: only a job with an http block has a target to allow'),
        ('  allow_remote_target = "yes"\n' + HTTP_BLOCK, 8,
         'job "a".allow_remote_target: must be true or false'),
    ],
)  # fmt: skip
def test_allow_remote_target_is_checked(body: str, line: int, says: str) -> None:
    problems = _problems(body)
    assert any(p.startswith(f"locks.hcl:{line}: {says}") for p in problems), problems


@pytest.mark.parametrize(
    ("url", "allow", "warned"),
    [
        ("http://127.0.0.1:8080/x", False, False),
        ("http://localhost:8080/x", False, False),
        ("http://[::1]:8080/x", False, False),
        ("http://app.internal:8080/x", False, True),
        ("http://10.1.2.3:8080/x", False, True),
        ("http://app.internal:8080/x", True, False),  # the job says it means it
        ("http://169.254.169.254:80/", True, False),  # allowed: no warning on top
    ],
)
def test_lint_warns_of_a_remote_target_at_the_urls_line(
    url: str, allow: bool, warned: bool
) -> None:
    extra = "  allow_remote_target = true\n" if allow else ""
    spec = parse_spec(_http_spec(url, extra), "locks.hcl")
    found = target_findings(spec)
    if not warned:
        assert found == []
        return
    line = 9 if not allow else 10
    assert [(f.severity, f.line, f.rule) for f in found] == [("warning", line, "remote-target")]
    host = url.split("//")[1].split(":")[0]
    assert f'job "a": http.url calls {host}, not the replica\'s own app' in found[0].message


def test_lockctl_lint_prints_the_remote_target_warning(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    Path("locks.hcl").write_text(_http_spec("http://app.internal:8080/jobs/x"))
    Path("s.hcl").write_text('session "w1" {\n  policy = "write"\n}\n')
    app = typer.Typer(cls=ErrorBoundaryGroup, pretty_exceptions_enable=False)
    app.command("lint")(policies.lint)
    app.command("render")(policies.render)
    result = CliRunner().invoke(app, ["lint", "--spec", "locks.hcl", "s.hcl"])
    print(result.stdout)  # for the docs
    assert result.exit_code == 1
    assert result.stdout == (
        'locks.hcl:9: warning: remote-target: job "a": http.url calls app.internal, not the '
        "replica's own app on loopback: the answer's first 2 KB go into the tick record, which "
        "every reader of the job's prefix can read (fix: call the app on 127.0.0.1 or "
        "localhost, or set allow_remote_target = true)\n"
    )
    assert result.stderr == "lockctl lint: 1 file, 0 errors, 1 warnings\n"
