"""The worker config loader: every problem as `FILE: field: message`, all at once, and the
fencing bound refused unless --allow-unsafe."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from provision.consul import GivenSettings, resolve_settings
from provision.durations import parse_duration
from provision.errors import EXIT_INPUT, InputError
from provision.spec import parse_spec
from provision.timings import COUNT_DEFAULTS, DEFAULTS, CatchupReach
from provision.workers.config import (
    MAX_CONFIG_BYTES,
    ConfigError,
    JobConfig,
    JobTimings,
    WorkerTLS,
    config_record,
    load_worker_config,
)

GOOD: dict[str, Any] = {
    "format": 1,
    "worker": "worker-1",
    "consul": {"address": "http://127.0.0.21:8500", "token_file": "/etc/lockctl/w1.token"},
    "jobs": {
        "report": {
            "lock_key": "locks/report/.lock",
            "ttl": "15s",
            "lock_delay": "15s",
            "renew_interval": "5s",
            "kill_grace": "5s",
            "min_hold": "1m",
            "schedule": "@hourly",
            "start_deadline": "90s",
            "history_limit": 50,
            "command": ["/usr/local/bin/report", "--hourly", ""],
        },
        "ingest": {
            "lock_key": "locks/ingest/.lock",
            "ttl": "30s",
            "lock_delay": "20s",
            "renew_interval": "10s",
            "kill_grace": "5s",
            "min_hold": None,
            "schedule": None,
        },
    },
}


def _write(tmp_path: Path, data: Any) -> Path:
    path = tmp_path / "lockctl.json"
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return path


def _with(**changes: Any) -> dict[str, Any]:
    """GOOD with dotted-path changes; the value DELETE removes the field."""
    data = copy.deepcopy(GOOD)
    for dotted, value in changes.items():
        *parents, last = dotted.split("__")
        target = data
        for part in parents:
            target = target[part]
        if value is DELETE:
            del target[last]
        else:
            target[last] = value
    return data


DELETE = object()


def _problems(tmp_path: Path, data: Any, *, allow_unsafe: bool = False) -> list[str]:
    path = _write(tmp_path, data)
    with pytest.raises(ConfigError) as caught:
        load_worker_config(path, allow_unsafe=allow_unsafe)
    prefix = f"{path}: "
    assert all(line.startswith(prefix) for line in caught.value.lines)
    return [line[len(prefix) :] for line in caught.value.lines]


def test_a_good_config_loads(tmp_path: Path) -> None:
    config = load_worker_config(_write(tmp_path, GOOD))
    assert config.worker == "worker-1"
    assert config.address == "http://127.0.0.21:8500"
    assert config.token_file == Path("/etc/lockctl/w1.token")
    assert [job.name for job in config.jobs] == ["ingest", "report"]  # sorted
    report = config.job("report")
    assert report.lock_key == "locks/report/.lock"
    assert report.timings == JobTimings(15.0, 15.0, 5.0, 5.0, 60.0, start_deadline=90.0)
    assert report.schedule == "@hourly"
    assert report.history_limit == 50
    assert report.command == ("/usr/local/bin/report", "--hourly", "")  # an empty argument is one
    ingest = config.job("ingest")
    assert ingest.timings.min_hold == 0.0 and ingest.schedule is None
    assert ingest.command is None  # no command field: a config from before it
    no_command = load_worker_config(_write(tmp_path, _with(jobs__report__command=None)))
    assert no_command.job("report").command is None


@pytest.mark.parametrize(
    ("value", "expected"),
    [(DELETE, None), (None, None), ("30m", 1800.0), ("2s", 2.0), ("1s", 1.0), ("168h", 604800.0)],
)
def test_timeout_is_seconds_or_none_for_no_limit(
    tmp_path: Path, value: object, expected: float | None
) -> None:
    data = GOOD if value is DELETE else _with(jobs__report__timeout=value)  # GOOD has none
    config = load_worker_config(_write(tmp_path, data))
    assert config.job("report").timings.timeout == expected


def test_the_spec_timeout_reaches_the_worker_config_only_when_set(tmp_path: Path) -> None:
    text = (
        'worker "worker-1" { address = "http://127.0.0.21:8500" }\n'
        'defaults { timeout = "30m" }\n'
        'job "a" {\n  prefix = "locks/a/"\n  workers = ["worker-1"]\n}\n'
        'job "b" {\n  prefix = "locks/b/"\n  workers = ["worker-1"]\n  timeout = "2s"\n}\n'
    )
    record = config_record(parse_spec(text, "t.hcl"), "worker-1", Path("/t"))
    assert (record["jobs"]["a"]["timeout"], record["jobs"]["b"]["timeout"]) == ("30m", "2s")
    loaded = load_worker_config(_write(tmp_path, record))
    assert (loaded.job("a").timings.timeout, loaded.job("b").timings.timeout) == (1800.0, 2.0)
    unset = config_record(
        parse_spec(text.replace('timeout = "30m"', ""), "t.hcl"), "worker-1", Path("/t")
    )
    assert "timeout" not in unset["jobs"]["a"]  # an older lockctl refuses fields it does not know


def test_the_spec_catchup_reaches_the_worker_config_only_when_latest(tmp_path: Path) -> None:
    text = (
        'worker "worker-1" { address = "http://127.0.0.21:8500" }\n'
        'defaults { catchup = "latest" }\n'
        'job "a" {\n  prefix = "locks/a/"\n  workers = ["worker-1"]\n}\n'
        'job "b" {\n  prefix = "locks/b/"\n  workers = ["worker-1"]\n  catchup = "skip"\n}\n'
    )
    record = config_record(parse_spec(text, "t.hcl"), "worker-1", Path("/t"))
    assert record["jobs"]["a"]["catchup"] == "latest"
    assert "catchup" not in record["jobs"]["b"]  # an older lockctl refuses fields it does not know
    loaded = load_worker_config(_write(tmp_path, record))
    assert (loaded.job("a").catchup, loaded.job("b").catchup) == ("latest", "skip")


def test_the_spec_catchup_all_reaches_the_worker_config_with_its_reach(tmp_path: Path) -> None:
    text = (
        'worker "worker-1" { address = "http://127.0.0.21:8500" }\n'
        'defaults {\n  catchup = "all"\n  catchup_window = "2h"\n}\n'
        'job "a" {\n  prefix = "locks/a/"\n  workers = ["worker-1"]\n  catchup_limit = 3\n}\n'
        'job "b" {\n  prefix = "locks/b/"\n  workers = ["worker-1"]\n  catchup = "latest"\n}\n'
    )
    record = config_record(parse_spec(text, "t.hcl"), "worker-1", Path("/t"))
    job_a, job_b = record["jobs"]["a"], record["jobs"]["b"]
    assert (job_a["catchup"], job_a["catchup_window"], job_a["catchup_limit"]) == ("all", "2h", 3)
    assert "catchup_window" not in job_b and "catchup_limit" not in job_b  # only with "all"
    loaded = load_worker_config(_write(tmp_path, record))
    assert loaded.job("a").catchup_reach == CatchupReach(7200.0, 3)
    assert loaded.job("b").catchup_reach == CatchupReach()  # the defaults: 1h, 10


def test_the_spec_overlap_reaches_the_worker_config_only_when_not_skip(tmp_path: Path) -> None:
    text = (
        'worker "worker-1" { address = "http://127.0.0.21:8500" }\n'
        'defaults {\n  overlap = "cancel"\n}\n'
        'job "a" {\n  prefix = "locks/a/"\n  workers = ["worker-1"]\n  schedule = "@every 5s"\n}\n'
        'job "b" {\n  prefix = "locks/b/"\n  workers = ["worker-1"]\n  schedule = "@every 5s"\n'
        '  overlap = "skip"\n}\n'
        'job "c" {\n  prefix = "locks/c/"\n  workers = ["worker-1"]\n  schedule = "@every 5s"\n'
        '  overlap = "buffer_one"\n}\n'
    )
    record = config_record(parse_spec(text, "t.hcl"), "worker-1", Path("/t"))
    assert record["jobs"]["a"]["overlap"] == "cancel"
    assert record["jobs"]["c"]["overlap"] == "buffer_one"
    assert "overlap" not in record["jobs"]["b"]  # an older lockctl refuses fields it does not know
    loaded = load_worker_config(_write(tmp_path, record))
    overlaps = (loaded.job("a").overlap, loaded.job("b").overlap, loaded.job("c").overlap)
    assert overlaps == ("cancel", "skip", "buffer_one")


@pytest.mark.parametrize("word", ["allow", "buffer_all", "Cancel", 1])
def test_a_config_overlap_the_spec_would_refuse_is_refused(tmp_path: Path, word: object) -> None:
    problems = _problems(tmp_path, _with(jobs__report__overlap=word))
    assert any(p.startswith("jobs.report.overlap: ") for p in problems), problems


@pytest.mark.parametrize(
    ("window", "limit", "expected"),
    [
        ("0s", 3, "jobs.report.catchup_window: "),
        ("169h", 3, "jobs.report.catchup_window: "),
        (3600, 3, "jobs.report.catchup_window: "),
        ("1h", 0, "jobs.report.catchup_limit: 0 is outside 1..1000"),
        ("1h", "3", "jobs.report.catchup_limit: must be a whole number"),
    ],
)
def test_a_config_catchup_reach_the_spec_would_refuse_is_refused(
    tmp_path: Path, window: object, limit: object, expected: str
) -> None:
    data = _with(
        jobs__report__catchup="all",
        jobs__report__catchup_window=window,
        jobs__report__catchup_limit=limit,
    )
    problems = _problems(tmp_path, data)
    assert any(p.startswith(expected) for p in problems), problems


def test_a_config_without_the_catchup_reach_loads_with_its_defaults(tmp_path: Path) -> None:
    report = load_worker_config(_write(tmp_path, _with(jobs__report__catchup="all"))).job("report")
    assert (report.catchup, report.catchup_reach) == ("all", CatchupReach(3600.0, 10))


def test_a_config_from_an_older_lockctl_gets_the_ledger_defaults(tmp_path: Path) -> None:
    data = _with(jobs__report__start_deadline=DELETE, jobs__report__history_limit=DELETE)
    report = load_worker_config(_write(tmp_path, data)).job("report")
    assert (report.timings.start_deadline, report.history_limit) == (300.0, 50)
    ingest = load_worker_config(_write(tmp_path, GOOD)).job("ingest")  # never had them
    assert (ingest.timings.start_deadline, ingest.history_limit) == (300.0, 50)


def test_job_config_defaults_are_the_spec_defaults() -> None:
    job = JobConfig("a", "locks/a/.lock", JobTimings(15.0, 15.0, 5.0, 5.0, 0.0), None)
    assert job.timings.start_deadline == parse_duration(DEFAULTS["start_deadline"]).seconds
    assert job.history_limit == COUNT_DEFAULTS["history_limit"]
    assert job.command is None


JOBS = (
    'worker "w" {}\n'
    'job "a" {\n  prefix = "l/a/"\n  workers = ["w"]\n  schedule = "@hourly"\n'
    '  command = ["/bin/sh", "-c", "echo $X"]\n}\n'
    'job "b" {\n  prefix = "l/b/"\n  workers = ["w"]\n  start_deadline = "10s"\n'
    "  history_limit = 10000\n}\n"
)


@pytest.mark.parametrize(
    ("defaults", "a_has"),
    [
        ("", (300.0, 50)),  # the built-in defaults
        ('defaults {\n  start_deadline = "2m"\n  history_limit = 30\n}\n', (120.0, 30)),
    ],
)
def test_the_spec_s_ledger_settings_reach_the_runner(
    tmp_path: Path, defaults: str, a_has: tuple[float, int]
) -> None:
    record = config_record(parse_spec(defaults + JOBS, "s.hcl"), "w", Path("/x/w.token"))
    assert record["jobs"]["b"]["start_deadline"] == "10s"
    assert record["jobs"]["b"]["history_limit"] == 10000
    assert (record["jobs"]["a"]["command"], record["jobs"]["b"]["command"]) == (
        ["/bin/sh", "-c", "echo $X"],
        None,
    )
    config = load_worker_config(_write(tmp_path, record))
    assert (config.job("a").timings.start_deadline, config.job("a").history_limit) == a_has
    assert (config.job("b").timings.start_deadline, config.job("b").history_limit) == (10.0, 10000)
    assert (config.job("a").command, config.job("b").command) == (
        ("/bin/sh", "-c", "echo $X"),
        None,
    )


def test_an_unknown_job_names_the_known_ones(tmp_path: Path) -> None:
    config = load_worker_config(_write(tmp_path, GOOD))
    with pytest.raises(InputError, match=r"no job 'nope' .*\(jobs: ingest, report\)"):
        config.job("nope")


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        ([1, 2], "top level must be an object"),
        (_with(format=2), "format: must be 1"),
        (_with(format=True), "format: must be 1"),
        (_with(format=DELETE), "format: must be 1"),
        (
            _with(extra=1),
            "extra: unknown field (known: agentless, consul, format, jobs, max_concurrent_runs, "
            "worker)",
        ),
        (_with(worker=""), "worker: must be a non-empty string"),
        (_with(worker=7), "worker: must be a non-empty string"),
        (_with(consul="http://x"), "consul: must be an object with address and token_file"),
        (
            _with(consul__token=1),
            "consul.token: unknown field (known: address, ca_file, cert_file, key_file, "
            "login, token_file)",
        ),
        (_with(consul__address=DELETE), "consul.address: must be a non-empty string"),
        (_with(consul__token_file=None), "consul.token_file: must be a non-empty string"),
        (_with(consul__ca_file="ca.pem"), "consul.ca_file: must be an absolute path"),
        (_with(consul__key_file=7), "consul.key_file: must be an absolute path"),
        (
            _with(consul__address="https://a:8501", consul__cert_file="/tls/w.pem"),
            "consul.cert_file and consul.key_file: give both (the client pair) or neither",
        ),
        (
            _with(consul__ca_file="/tls/ca.pem"),
            "consul.ca_file: given, but consul.address 'http://127.0.0.21:8500' is not https://",
        ),
        (_with(jobs={}), "jobs: must be a non-empty object of job name -> settings"),
        (_with(jobs=[]), "jobs: must be a non-empty object of job name -> settings"),
        (_with(jobs__report="x"), "jobs.report: must be an object"),
        (_with(jobs__report__prefix="x"), "jobs.report.prefix: unknown field (known: "),
        (_with(jobs__report__lock_key=""), "jobs.report.lock_key: must be a non-empty string"),
        (_with(jobs__report__ttl=15), 'jobs.report.ttl: must be a duration string such as "15s"'),
        (_with(jobs__report__ttl=DELETE), "jobs.report.ttl: must be a duration string"),
        (_with(jobs__report__ttl="15 s"), "jobs.report.ttl: '15 s' is not a duration"),
        (_with(jobs__report__ttl="5s"), "jobs.report.ttl: 5s is outside 10s..24h"),
        (_with(jobs__report__ttl="25h"), "jobs.report.ttl: 25h is outside 10s..24h"),
        (_with(jobs__report__lock_delay="61s"), "jobs.report.lock_delay: 61s is outside 0s..1m"),
        (_with(jobs__report__kill_grace="-1s"), "jobs.report.kill_grace: -1s is outside"),
        (_with(jobs__report__renew_interval="50ms"), "jobs.report.renew_interval: 50ms is outs"),
        (_with(jobs__report__min_hold="1d"), "jobs.report.min_hold: '1d' is not a duration"),
        (_with(jobs__report__schedule=5), "jobs.report.schedule: must be a string or null"),
        (
            _with(jobs__report__timeout=30),
            "jobs.report.timeout: must be a duration string such",
        ),
        (_with(jobs__report__timeout="0s"), "jobs.report.timeout: 0s is outside 1s..168h"),
        (_with(jobs__report__catchup="every"), 'jobs.report.catchup: must be "skip", "latest" or'),
        (_with(jobs__report__catchup=None), 'jobs.report.catchup: must be "skip", "latest" or'),
        (
            _with(jobs__report__timeout="169h"),
            "jobs.report.timeout: 169h is outside 1s..168h",
        ),
        (
            _with(jobs__report__timeout="soon"),
            "jobs.report.timeout: 'soon' is not a duration",
        ),
        (
            _with(jobs__report__start_deadline=300),
            "jobs.report.start_deadline: must be a dura",
        ),
        (
            _with(jobs__report__start_deadline=None),
            "jobs.report.start_deadline: must be a dura",
        ),
        (
            _with(jobs__report__start_deadline="5 min"),
            "jobs.report.start_deadline: '5 min' is no",
        ),
        (
            _with(jobs__report__start_deadline="999ms"),
            "jobs.report.start_deadline: 999ms is outside 1s..24h",
        ),
        (
            _with(jobs__report__start_deadline="24h0m1s"),
            "jobs.report.start_deadline: 24h0m1s is outside 1s..24h",
        ),
        (_with(jobs__report__history_limit="200"), "jobs.report.history_limit: must be a whole "),
        (_with(jobs__report__history_limit=200.0), "jobs.report.history_limit: must be a whole "),
        (_with(jobs__report__history_limit=True), "jobs.report.history_limit: must be a whole "),
        (_with(jobs__report__history_limit=None), "jobs.report.history_limit: must be a whole "),
        (_with(jobs__report__history_limit=9), "jobs.report.history_limit: 9 is outside 10..10000"),
        (
            _with(jobs__report__history_limit=10001),
            "jobs.report.history_limit: 10001 is outside 10..10000",
        ),
        (_with(jobs__report__command="/bin/x"), "jobs.report.command: must be a non-empty list"),
        (_with(jobs__report__command=[]), "jobs.report.command: must be a non-empty list"),
        (_with(jobs__report__command=["/bin/x", 1]), "jobs.report.command: must be a non-empty "),
        (_with(jobs__report__command=[""]), "jobs.report.command: the program (its first item)"),
        (
            _with(jobs__report__command=["/bin/x"] * 257),
            "jobs.report.command: has 257 arguments, at most 256 allowed",
        ),
        (
            _with(jobs__report__command=["/bin/x", "y" * 4097]),
            "jobs.report.command: item 1 is longer than 4096 characters",
        ),
        (
            _with(jobs__report__command=["/bin/x", "a\0b"]),
            "jobs.report.command: item 1 contains a NUL character",
        ),
        (
            _with(jobs__report__command=["/bin/x\ud800"]),
            "jobs.report.command: item 0 is not valid text (a lone surrogate)",
        ),
        (
            _with(jobs__report__renew_interval="7500ms"),
            "jobs.report.renew_interval: 7500ms must be below ttl/2 = 7.5s",
        ),
    ],
)
def test_each_problem_names_its_field(tmp_path: Path, data: Any, expected: str) -> None:
    problems = _problems(tmp_path, data)
    assert any(p.startswith(expected) for p in problems), problems


def test_the_longest_command_allowed_loads(tmp_path: Path) -> None:
    argv = ["/bin/x", *["y" * 4096] * 255]
    config = load_worker_config(_write(tmp_path, _with(jobs__report__command=argv)))
    assert config.job("report").command == tuple(argv)


def test_not_json_names_the_file_and_line(tmp_path: Path) -> None:
    path = _write(tmp_path, '{\n  "format": 1,\n  oops\n}')
    with pytest.raises(InputError) as caught:
        load_worker_config(path)
    assert str(caught.value).startswith(f"{path}:3: not a JSON worker config")
    assert caught.value.exit_code == EXIT_INPUT


def test_not_utf8_and_unreadable_and_too_large(tmp_path: Path) -> None:
    path = tmp_path / "latin1.json"
    path.write_bytes(b'{"worker": "\xe9"}')
    with pytest.raises(InputError, match=r"latin1.json: not a JSON worker config"):
        load_worker_config(path)
    with pytest.raises(InputError, match=r"missing.json: cannot read worker config"):
        load_worker_config(tmp_path / "missing.json")
    big = tmp_path / "big.json"
    big.write_text(" " * (MAX_CONFIG_BYTES + 1))
    with pytest.raises(InputError, match=r"big.json: larger than"):
        load_worker_config(big)


def test_an_integer_too_long_for_python_is_bad_input_not_a_traceback(tmp_path: Path) -> None:
    text = json.dumps(GOOD).replace('"history_limit": 50', '"history_limit": ' + "9" * 5000)
    with pytest.raises(InputError, match=r"lockctl.json: not a JSON worker config \(Exceeds"):
        load_worker_config(_write(tmp_path, text))


def test_every_problem_is_reported_at_once(tmp_path: Path) -> None:
    data = _with(
        worker="",
        consul__address=DELETE,
        jobs__report__ttl="nope",
        jobs__ingest__kill_grace="2h",
    )
    problems = _problems(tmp_path, data)
    assert [p.split(":")[0] for p in problems] == [
        "worker",
        "consul.address",
        "jobs.ingest.kill_grace",
        "jobs.report.ttl",
    ]
    with pytest.raises(ConfigError) as caught:
        load_worker_config(tmp_path / "lockctl.json")
    assert str(caught.value) == f"{tmp_path / 'lockctl.json'}: 4 problems"
    assert caught.value.problems == caught.value.lines  # the CLI prints each


def test_a_single_problem_is_the_message_itself(tmp_path: Path) -> None:
    path = _write(tmp_path, _with(extra=1))
    with pytest.raises(ConfigError) as caught:
        load_worker_config(path)
    assert str(caught.value) == caught.value.lines[0]
    assert caught.value.problems == []  # not printed twice by the CLI


# --- the fencing bound: D > R + G + 1s ------------------------------------------------------


@pytest.mark.parametrize(
    ("lock_delay", "renew", "grace", "safe"),
    [
        ("15s", "5s", "5s", True),  # 15 > 11
        ("11s", "5s", "5s", False),  # 11 = 11: not above
        ("10s", "5s", "5s", False),
        ("4s", "1s", "1s", True),
        ("3s", "1s", "1s", False),
        ("0s", "3s", "0s", False),
        ("3s", "1s", "0s", True),
        ("2500ms", "1s", "0s", True),  # the shortest renewal the timings allow (1 s)
    ],
)
def test_the_fencing_bound(
    tmp_path: Path, lock_delay: str, renew: str, grace: str, safe: bool
) -> None:
    data = _with(
        jobs__report__lock_delay=lock_delay,
        jobs__report__renew_interval=renew,
        jobs__report__kill_grace=grace,
    )
    path = _write(tmp_path, data)
    if safe:
        load_worker_config(path)
        return
    problems = _problems(tmp_path, data)
    assert len(problems) == 1
    assert problems[0].startswith(f"jobs.report.lock_delay: lock_delay {lock_delay}")
    assert "renew_interval" in problems[0] and "kill_grace" in problems[0]
    assert problems[0].endswith("--allow-unsafe runs anyway")
    unsafe = load_worker_config(path, allow_unsafe=True).job("report").timings
    assert unsafe.lock_delay < unsafe.renew_interval + unsafe.kill_grace + 1.0 + 1e-9


def test_allow_unsafe_skips_only_the_fencing_bound(tmp_path: Path) -> None:
    data = _with(jobs__report__lock_delay="1s", jobs__report__ttl="5s")
    problems = _problems(tmp_path, data, allow_unsafe=True)
    assert [p.split(":")[0] for p in problems] == ["jobs.report.ttl"]


def test_the_tls_files_reach_the_consul_settings(tmp_path: Path) -> None:
    tls = {"ca_file": "/tls/ca.pem", "cert_file": "/tls/w1.pem", "key_file": "/tls/w1-key.pem"}
    data = _with(consul={**GOOD["consul"], "address": "https://127.0.0.21:8501", **tls})
    config = load_worker_config(_write(tmp_path, data))
    assert config.tls == WorkerTLS(
        Path("/tls/ca.pem"), Path("/tls/w1.pem"), Path("/tls/w1-key.pem")
    )
    assert config.connection() == {
        "given": GivenSettings(
            address="https://127.0.0.21:8501",
            token_file=Path("/etc/lockctl/w1.token"),
            ca_cert=Path("/tls/ca.pem"),
            client_cert=Path("/tls/w1.pem"),
            client_key=Path("/tls/w1-key.pem"),
            given_by=(
                ("token_file", f"{config.path}: consul.token_file"),
                ("ca_cert", f"{config.path}: consul.ca_file"),
                ("client_cert", f"{config.path}: consul.cert_file"),
                ("client_key", f"{config.path}: consul.key_file"),
            ),
        )
    }
    plain = load_worker_config(_write(tmp_path, GOOD))
    assert plain.tls == WorkerTLS() and plain.connection()["given"].ca_cert is None


@pytest.mark.parametrize(
    ("field", "named"),
    [
        ("ca_file", "consul.ca_file"),
        ("cert_file", "consul.cert_file"),
        ("key_file", "consul.key_file"),
    ],
)
def test_a_missing_tls_file_of_the_config_is_named_by_its_key(
    tmp_path: Path, field: str, named: str
) -> None:
    (tmp_path / "w1.token").write_text("00000000-0000-0000-0000-000000000001\n")
    for name in ("ca.pem", "w1.pem", "w1-key.pem"):
        (tmp_path / name).write_text("x")
    tls = {
        "ca_file": str(tmp_path / "ca.pem"),
        "cert_file": str(tmp_path / "w1.pem"),
        "key_file": str(tmp_path / "w1-key.pem"),
    }
    missing = str(tmp_path / "gone.pem")
    tls[field] = missing
    consul = {"address": "https://127.0.0.21:8501", "token_file": str(tmp_path / "w1.token")}
    config = load_worker_config(_write(tmp_path, _with(consul={**consul, **tls})))
    env = {"CONSUL_CLIENT_CERT": "/elsewhere.pem"}  # the config's wins, and is the one named
    with pytest.raises(InputError) as raised:
        resolve_settings(**config.connection(), env=env)
    assert str(raised.value) == f"{config.path}: {named} {missing}: no such file or folder"


def test_the_tls_folder_names_each_worker_s_pair() -> None:
    tls = WorkerTLS.in_folder(Path("/etc/lockctl/tls"), "worker-2")
    assert tls.record() == {
        "ca_file": "/etc/lockctl/tls/ca.pem",
        "cert_file": "/etc/lockctl/tls/worker-2.pem",
        "key_file": "/etc/lockctl/tls/worker-2-key.pem",
    }
    assert WorkerTLS().record() == {}


def test_jitter_and_the_job_s_workers_load_and_default_for_an_older_config(tmp_path: Path) -> None:
    data = _with(jobs__report__jitter="30s", jobs__report__workers=["worker-1", "worker-2"])
    report = load_worker_config(_write(tmp_path, data)).job("report")
    assert (report.timings.jitter, report.workers) == (30.0, ("worker-1", "worker-2"))
    older = load_worker_config(_write(tmp_path, GOOD)).job("report")
    assert (older.timings.jitter, older.workers) == (0.0, ())


@pytest.mark.parametrize(
    ("field", "value", "problem"),
    [
        (
            "jitter",
            "90s",
            "jobs.report.jitter: jitter 90s must be below start_deadline 90s",
        ),
        ("jitter", "2h", "jobs.report.jitter: 2h is outside 0s..1h"),
        ("workers", "worker-1", "jobs.report.workers: must be a list of up to 1000 worker names"),
        ("workers", ["worker-1", 7], "jobs.report.workers: must be a list of up to 1000"),
        ("workers", ["w"] * 1001, "jobs.report.workers: must be a list of up to 1000"),
    ],
)
def test_a_bad_jitter_or_workers_is_refused_naming_the_field(
    tmp_path: Path, field: str, value: Any, problem: str
) -> None:
    problems = _problems(tmp_path, _with(**{f"jobs__report__{field}": value}))
    assert len(problems) == 1 and problems[0].startswith(problem), problems


def test_a_keyed_jobs_keys_reach_the_worker_config_and_are_checked_again(tmp_path: Path) -> None:
    text = (
        'worker "worker-1" { address = "http://127.0.0.21:8500" }\n'
        'job "a" {\n  prefix = "locks/a/"\n  workers = ["worker-1"]\n  schedule = "@every 5s"\n'
        '  keys = ["t-1", "t-2"]\n}\n'
        'job "b" {\n  prefix = "locks/b/"\n  workers = ["worker-1"]\n  schedule = "@every 5s"\n}\n'
    )
    record = config_record(parse_spec(text, "t.hcl"), "worker-1", Path("/t"))
    assert record["jobs"]["a"]["keys"] == ["t-1", "t-2"]
    assert "keys" not in record["jobs"]["b"]  # an older lockctl refuses fields it does not know
    loaded = load_worker_config(_write(tmp_path, record))
    units = [(u.unit, u.lock_key) for u in loaded.job("a").units()]
    assert units == [("a/t-1", "locks/a/keys/t-1/.lock"), ("a/t-2", "locks/a/keys/t-2/.lock")]
    assert [u.unit for u in loaded.job("b").units()] == ["b"]
    record["jobs"]["a"]["keys"] = ["t-1", "../b"]
    problems = _problems(tmp_path, record)
    assert any(p.startswith("jobs.a.keys: '../b' must be") for p in problems), problems
