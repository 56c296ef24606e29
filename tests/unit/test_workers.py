"""Worker files: golden output for the example spec, systemd quoting, units only for jobs with
a schedule and a command, the scheduler's unit, and never a secret in any generated file."""

from __future__ import annotations

import configparser
import json
import shutil
import stat
import subprocess
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from provision.cli import app
from provision.errors import InputError
from provision.spec import load_spec, parse_spec
from provision.workers.config import config_record as worker_config
from provision.workers.config import load_worker_config
from provision.workers.files import Placement, systemd_quote, write_worker_files

ROOT = Path(__file__).resolve().parents[2]
TEMPLATES = ROOT / "templates"
EXAMPLE = ROOT / "policies" / "locks.hcl"
GOLDEN = ROOT / "tests" / "golden" / "workers" / "example"
PLACEMENT = Placement(Path("/etc/lockctl"), Path("/etc/lockctl/secrets"), "/usr/local/bin/lockctl")
SECRET = "0c8e1b5e-7a2d-4f61-9d3c-5b9a1e2f4c70"


def _tree(folder: Path) -> dict[str, str]:
    return {
        str(path.relative_to(folder)): path.read_text()
        for path in sorted(folder.rglob("*"))
        if path.is_file()
    }


def test_golden_example(tmp_path: Path) -> None:
    spec = load_spec(EXAMPLE)
    results = write_worker_files(
        spec, ["worker-1", "worker-2", "worker-3"], tmp_path, TEMPLATES, PLACEMENT
    )
    assert _tree(tmp_path) == _tree(GOLDEN)
    assert [r.worker for r in results] == ["worker-1", "worker-2", "worker-3"]
    assert all(r.jobs_without_unit == () for r in results)
    for path in tmp_path.rglob("*"):
        if path.is_file():
            assert stat.S_IMODE(path.stat().st_mode) == 0o644, path
    assert not list(tmp_path.rglob(".*.tmp"))


def test_the_config_is_what_the_runner_loads(tmp_path: Path) -> None:
    spec = load_spec(EXAMPLE)
    write_worker_files(spec, ["worker-2"], tmp_path, TEMPLATES, PLACEMENT)
    config = load_worker_config(tmp_path / "worker-2" / "lockctl.json")
    assert config.worker == "worker-2"
    assert config.address == "https://127.0.0.22:8501"
    assert config.token_file == Path("/etc/lockctl/secrets/worker-2.token")
    cleanup = config.job("session-cleanup")
    assert cleanup.lock_key == "locks/session-cleanup/.lock"
    timings = cleanup.timings
    assert (timings.ttl, timings.lock_delay, timings.renew_interval) == (15.0, 10.0, 4.0)
    assert (timings.kill_grace, timings.min_hold) == (3.0, 0.0)
    assert config.job("hourly-report").timings.min_hold == 0.0  # the tick ledger needs none
    assert config.job("nightly-ingest").timings.renew_interval == 10.0  # ttl/3
    assert cleanup.command == ("/usr/local/bin/app-admin", "cleanup-sessions")  # for `schedule`
    raw = json.loads((tmp_path / "worker-2" / "lockctl.json").read_text())
    assert raw == worker_config(spec, "worker-2", Path("/etc/lockctl/secrets/worker-2.token"))


def test_only_the_named_workers_and_their_jobs(tmp_path: Path) -> None:
    spec = load_spec(EXAMPLE)
    write_worker_files(spec, ["worker-3"], tmp_path, TEMPLATES, PLACEMENT)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["worker-3"]
    units = sorted(p.name for p in (tmp_path / "worker-3" / "systemd").iterdir())
    assert units == [
        "lockctl-cache-refresh.service",
        "lockctl-cache-refresh.timer",
        "lockctl-hourly-report.service",
        "lockctl-hourly-report.timer",
        "lockctl-scheduler.service",
        "lockctl-session-cleanup.service",
        "lockctl-session-cleanup.timer",
    ]
    with pytest.raises(InputError, match=r"--worker worker-9: not a worker in .*worker-1"):
        write_worker_files(spec, ["worker-9"], tmp_path, TEMPLATES, PLACEMENT)


def test_without_config_dir_the_output_folder_is_named(tmp_path: Path) -> None:
    spec = load_spec(EXAMPLE)
    placement = Placement(None, Path("/secrets"), "lockctl")  # a bare name: systemd looks it up
    write_worker_files(spec, ["worker-1"], tmp_path / "out", TEMPLATES, placement)
    config_path = (tmp_path / "out" / "worker-1" / "lockctl.json").absolute()
    env = (tmp_path / "out" / "worker-1" / "lockctl.env").read_text()
    assert f"LOCKCTL_CONFIG={config_path}\n" in env
    service = tmp_path / "out" / "worker-1" / "systemd" / "lockctl-hourly-report.service"
    assert f'"--config" "{config_path}"' in service.read_text()


# --- jobs without a schedule or a command get no unit ---------------------------------------

PARTIAL = """\
worker "w1" {}
job "both" {
  prefix   = "locks/both/"
  workers  = ["w1"]
  schedule = "@hourly"
  command  = ["/bin/true"]
}
job "no-schedule" {
  prefix  = "locks/no-schedule/"
  workers = ["w1"]
  command = ["/bin/true"]
}
job "no-command" {
  prefix   = "locks/no-command/"
  workers  = ["w1"]
  schedule = "@daily"
}
job "neither" {
  prefix  = "locks/neither/"
  workers = ["w1"]
}
"""


def test_jobs_without_schedule_or_command_get_no_unit(tmp_path: Path) -> None:
    spec = parse_spec(PARTIAL, str(tmp_path / "locks.hcl"))
    (result,) = write_worker_files(spec, ["w1"], tmp_path, TEMPLATES, PLACEMENT)
    assert result.jobs_without_unit == ("neither", "no-command", "no-schedule")
    units = sorted(p.name for p in (tmp_path / "w1" / "systemd").iterdir())
    assert units == ["lockctl-both.service", "lockctl-both.timer", "lockctl-scheduler.service"]
    config = load_worker_config(tmp_path / "w1" / "lockctl.json")
    assert [job.name for job in config.jobs] == ["both", "neither", "no-command", "no-schedule"]
    assert [job.command for job in config.jobs] == [("/bin/true",), None, None, ("/bin/true",)]
    scheduler = (tmp_path / "w1" / "systemd" / "lockctl-scheduler.service").read_text()
    assert "# both\n" in scheduler  # its jobs: only the one with a schedule and a command


KEYED = """
worker "w1" {
  address = "http://127.0.0.21:8500"
}
job "report" {
  prefix   = "locks/report/"
  workers  = ["w1"]
  schedule = "@hourly"
  keys     = ["tenant-1", "tenant-2"]
  command  = ["/usr/local/bin/report"]
}
"""


def test_a_keyed_job_gets_a_timer_for_each_key_and_none_for_itself(tmp_path: Path) -> None:
    spec = parse_spec(KEYED, str(tmp_path / "locks.hcl"))
    write_worker_files(spec, ["w1"], tmp_path, TEMPLATES, PLACEMENT)
    folder = tmp_path / "w1" / "systemd"
    assert sorted(p.name for p in folder.iterdir()) == [
        "lockctl-report@tenant-1.service",
        "lockctl-report@tenant-1.timer",
        "lockctl-report@tenant-2.service",
        "lockctl-report@tenant-2.timer",
        "lockctl-scheduler.service",
    ]
    service = (folder / "lockctl-report@tenant-2.service").read_text()
    assert '"--job" "report" "--key" "tenant-2" "--" "/usr/local/bin/report"\n' in service
    assert "Description=lockctl: report, key tenant-2 (on one worker at a time)" in service


def test_no_scheduler_unit_without_a_scheduled_job(tmp_path: Path) -> None:
    text = PARTIAL.replace('  command  = ["/bin/true"]\n', "", 1)  # "both" loses its command
    spec = parse_spec(text, str(tmp_path / "locks.hcl"))
    (result,) = write_worker_files(spec, ["w1"], tmp_path, TEMPLATES, PLACEMENT)
    assert result.jobs_without_unit == ("both", "neither", "no-command", "no-schedule")
    assert not (tmp_path / "w1" / "systemd").exists()
    assert sorted(p.name for p in (tmp_path / "w1").iterdir()) == ["lockctl.env", "lockctl.json"]


# --- the scheduler's unit ------------------------------------------------------------------

SCHEDULED = """\
worker "w1" {}
job "short" {
  prefix     = "locks/short/"
  workers    = ["w1"]
  schedule   = "@every 5s"
  kill_grace = "2500ms"
  lock_delay = "10s"
  command    = ["/bin/true"]
}
job "long" {
  prefix     = "locks/long/"
  workers    = ["w1"]
  schedule   = "@hourly"
  kill_grace = "7s"
  lock_delay = "15s"
  command    = ["/bin/sleep", "60"]
}
job "by-hand" {
  prefix     = "locks/by-hand/"
  workers    = ["w1"]
  kill_grace = "30s"
  lock_delay = "40s"
  command    = ["/bin/true"]
}
"""


def _scheduler_unit(tmp_path: Path, text: str = SCHEDULED) -> configparser.ConfigParser:
    spec = parse_spec(text, str(tmp_path / "locks.hcl"))
    write_worker_files(spec, ["w1"], tmp_path / "out", TEMPLATES, PLACEMENT)
    unit = configparser.ConfigParser(interpolation=None, strict=True)
    unit.optionxform = str  # type: ignore[assignment,method-assign]  # keys keep their case
    unit.read_string((tmp_path / "out/w1/systemd/lockctl-scheduler.service").read_text())
    return unit


def test_the_scheduler_unit_runs_lockctl_schedule_as_a_long_lived_service(tmp_path: Path) -> None:
    unit = _scheduler_unit(tmp_path)
    assert unit.sections() == ["Unit", "Service", "Install"]
    service = unit["Service"]
    assert _unquote_exec_start(service["ExecStart"]) == [
        "/usr/local/bin/lockctl",
        "schedule",
        "--config",
        "/etc/lockctl/lockctl.json",
    ]
    assert service["Type"] == "exec"
    assert service["Restart"] == "on-failure"
    assert service["RestartSec"] == "10"
    assert "RestartPreventExitStatus" not in service  # a bad config is tried again too
    assert unit["Unit"]["StartLimitIntervalSec"] == "0"  # and never given up on
    assert service["KillMode"] == "mixed"
    assert service["ExecReload"] == "kill -HUP $MAINPID"  # SIGHUP reloads the config
    assert unit["Install"]["WantedBy"] == "multi-user.target"


def test_the_scheduler_stop_timeout_is_the_longest_scheduled_grace_plus_the_margin(
    tmp_path: Path,
) -> None:
    # "long" has 7 s; "by-hand" (30 s) has no schedule: the scheduler never runs it
    assert _scheduler_unit(tmp_path)["Service"]["TimeoutStopSec"] == str(7 + 20)
    only_short = SCHEDULED.replace('schedule   = "@hourly"\n', "")
    assert _scheduler_unit(tmp_path, only_short)["Service"]["TimeoutStopSec"] == "23"  # 2.5 s up


def test_the_scheduler_unit_says_it_is_the_alternative_to_the_timers(tmp_path: Path) -> None:
    spec = parse_spec(SCHEDULED, str(tmp_path / "locks.hcl"))
    write_worker_files(spec, ["w1"], tmp_path, TEMPLATES, PLACEMENT)
    text = (tmp_path / "w1/systemd/lockctl-scheduler.service").read_text()
    assert "enable this service\n# or the timers, never both" in text
    assert "# long, short\n" in text
    assert "7s, the longest kill grace here (long), + 20s" in text
    env = (tmp_path / "w1" / "lockctl.env").read_text()
    assert "`docker run --env-file lockctl.env ... lockctl schedule`" in env
    assert "LOCKCTL_CONFIG=/etc/lockctl/lockctl.json\n" in env


def test_a_job_whose_unit_would_be_the_scheduler_s_is_refused(tmp_path: Path) -> None:
    spec = tmp_path / "locks.hcl"
    spec.write_text(SCHEDULED.replace('job "short"', 'job "scheduler"'))
    result = _cli(tmp_path / "out", spec=spec)
    assert result.exit_code == 2, result.output
    assert 'job "scheduler": its unit would be lockctl-scheduler.service' in result.stderr
    assert "Traceback" not in result.output
    assert not (tmp_path / "out").exists()


# --- systemd quoting -------------------------------------------------------------------------

NASTY = ["/bin/echo", "100%", "$HOME", "${X}", 'say "hi"', "back\\slash", "two words", "", "%%n"]


def _unquote_exec_start(line: str) -> list[str]:
    """A reference reading of one ExecStart= value, as systemd does it: words split on blanks,
    double-quoted words with C escapes, then `%%` -> `%` and `$$` -> `$`."""
    words: list[str] = []
    position = 0
    while position < len(line):
        if line[position] == " ":
            position += 1
            continue
        assert line[position] == '"', f"unquoted word at {position}: {line!r}"
        position += 1
        word = []
        while line[position] != '"':
            char = line[position]
            if char == "\\":
                following = line[position + 1]
                if following == "x":
                    word.append(chr(int(line[position + 2 : position + 4], 16)))
                    position += 4
                    continue
                assert following in '\\"', following
                word.append(following)
                position += 2
                continue
            assert char not in "%$" or line[position + 1] == char, f"lone {char} in {line!r}"
            word.append(char)
            position += 2 if char in "%$" else 1
        position += 1
        words.append("".join(word))
    return words


@pytest.mark.parametrize("argument", [*NASTY, "a\nb", "tab\there", "\x7f"])
def test_systemd_quote_round_trips(argument: str) -> None:
    quoted = systemd_quote(argument)
    assert "\n" not in quoted
    assert _unquote_exec_start(quoted) == [argument]


def test_systemd_quote_examples() -> None:
    assert systemd_quote("plain") == '"plain"'
    assert systemd_quote("100%") == '"100%%"'
    assert systemd_quote("$HOME") == '"$$HOME"'
    assert systemd_quote('a "b"') == '"a \\"b\\""'
    assert systemd_quote("c:\\x") == '"c:\\\\x"'
    assert systemd_quote("a\nb") == '"a\\x0ab"'


def _nasty_spec(tmp_path: Path) -> Path:
    # HCL strings escape like JSON, plus $${ and %%{ for a literal ${ and %{
    argv = ", ".join(json.dumps(a).replace("${", "$${").replace("%{", "%%{") for a in NASTY)
    path = tmp_path / "nasty dir" / "locks.hcl"
    path.parent.mkdir()
    path.write_text(
        'worker "w1" {}\n'
        'job "nasty" {\n'
        '  prefix   = "locks/nasty/"\n'
        '  workers  = ["w1"]\n'
        '  schedule = "0 2 * * *"\n'
        f"  command  = [{argv}]\n"
        "}\n"
    )
    return path


def test_a_unit_runs_exactly_the_spec_command(tmp_path: Path) -> None:
    spec = load_spec(_nasty_spec(tmp_path))
    assert spec.jobs[0].command == tuple(NASTY)
    placement = Placement(Path("/etc/lock ctl/100%"), Path("/s"), "/opt/my lockctl/bin/lockctl")
    write_worker_files(spec, ["w1"], tmp_path / "out", TEMPLATES, placement)
    service = tmp_path / "out" / "w1" / "systemd" / "lockctl-nasty.service"
    (exec_start,) = [
        line.removeprefix("ExecStart=")
        for line in service.read_text().splitlines()
        if line.startswith("ExecStart=")
    ]
    assert _unquote_exec_start(exec_start) == [
        "/opt/my lockctl/bin/lockctl",
        "run",
        "--config",
        "/etc/lock ctl/100%/lockctl.json",
        "--job",
        "nasty",
        "--",
        *NASTY,
    ]


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="needs systemd-analyze")
def test_systemd_accepts_the_units(tmp_path: Path) -> None:
    """systemd's own parser finds no error in the generated units (quoting, specifiers)."""
    spec = load_spec(_nasty_spec(tmp_path))
    placement = Placement(Path("/etc/lockctl"), Path("/s"), "/bin/echo")  # an existing program
    write_worker_files(spec, ["w1"], tmp_path / "out", TEMPLATES, placement)
    units = sorted(str(p) for p in (tmp_path / "out" / "w1" / "systemd").iterdir())
    result = subprocess.run(
        ["systemd-analyze", "verify", *units],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "lockctl-nasty.service" not in result.stderr, result.stderr
    assert units[-1].endswith("/lockctl-scheduler.service")  # checked as well
    assert "lockctl-scheduler.service" not in result.stderr, result.stderr


# --- no secret anywhere ------------------------------------------------------------------------


def test_no_secret_in_any_generated_file(tmp_path: Path) -> None:
    secrets = tmp_path / "secrets"
    secrets.mkdir()
    for worker in ("worker-1", "worker-2", "worker-3"):
        (secrets / f"{worker}.token").write_text(SECRET + "\n")
    spec = load_spec(EXAMPLE)
    placement = Placement(None, secrets, "/usr/local/bin/lockctl")
    write_worker_files(
        spec, ["worker-1", "worker-2", "worker-3"], tmp_path / "out", TEMPLATES, placement
    )
    files = [p for p in (tmp_path / "out").rglob("*") if p.is_file()]
    assert len(files) == 29  # 3 configs, 3 env files, 10 job units, 10 timers, 3 schedulers
    for path in files:
        text = path.read_text()
        assert SECRET not in text, path
        assert "CONSUL_HTTP_TOKEN=" not in text, path
    env = (tmp_path / "out" / "worker-1" / "lockctl.env").read_text()
    assert f"CONSUL_HTTP_TOKEN_FILE={secrets / 'worker-1.token'}\n" in env


# --- flag values that go into the files are checked: one line, exit 2, nothing written ---------

runner = CliRunner()


def _cli(out: Path, *flags: str, spec: Path = EXAMPLE) -> Any:
    return runner.invoke(
        app, ["worker-config", "--all", "--spec", str(spec), "--out", str(out), *flags]
    )


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        (["--secrets-dir", "/etc/x\nCONSUL_HTTP_TOKEN=evil"], "--secrets-dir '/etc/x\\nCONSUL"),
        (["--token-dir", "/etc/\x1b[2Jx"], "--secrets-dir '/etc/\\x1b[2Jx'"),
        (["--config-dir", "/etc/lockctl\nX=1"], "--config-dir '/etc/lockctl\\nX=1'"),
        (["--config-dir", "etc/lockctl"], "--config-dir 'etc/lockctl': must be an absolute path"),
        (["--lockctl", "bin/lockctl"], "--lockctl 'bin/lockctl': must be an absolute path"),
        (["--lockctl", "./lockctl"], "--lockctl './lockctl': must be an absolute path"),
        (["--lockctl", "/usr//bin/lockctl"], "--lockctl '/usr//bin/lockctl': must be a normalised"),
        (["--lockctl", "/usr/bin/../lockctl"], "must be a normalised path"),
        (["--lockctl", "/usr/bin/lockctl\n"], "--lockctl '/usr/bin/lockctl\\n': must not contain"),
        (["--lockctl", "lockctl\tx"], "--lockctl 'lockctl\\tx': must not contain control"),
        (["--tls-dir", "/etc/tls\nX=1"], "--tls-dir '/etc/tls\\nX=1': must not contain control"),
    ],
)
def test_flag_values_written_into_files_are_checked(
    tmp_path: Path, flags: list[str], expected: str
) -> None:
    result = _cli(tmp_path / "out", "--config-dir", "/etc/lockctl", *flags)
    assert result.exit_code == 2, result.output
    assert expected in result.stderr
    assert len(result.stderr.strip().splitlines()) <= 2  # the deprecation warning, the error
    assert "Traceback" not in result.output
    assert not (tmp_path / "out").exists()


def test_the_out_folder_is_checked_when_it_is_named_in_the_files(tmp_path: Path) -> None:
    result = _cli(tmp_path / "o\nut")  # no --config-dir: LOCKCTL_CONFIG names the out folder
    assert result.exit_code == 2, result.output
    assert "--out '" in result.stderr and "must not contain control characters" in result.stderr
    assert not list(tmp_path.iterdir())


def test_a_bare_program_name_and_a_space_in_a_path_are_accepted(tmp_path: Path) -> None:
    result = _cli(tmp_path / "out", "--config-dir", "/etc/lock ctl", "--lockctl", "lockctl")
    assert result.exit_code == 0, result.output
    service = tmp_path / "out/worker-1/systemd/lockctl-nightly-ingest.service"
    assert (
        'ExecStart="lockctl" "run" "--config" "/etc/lock ctl/lockctl.json"' in service.read_text()
    )


# --- all of a command's files, or none ------------------------------------------------------

IDLE = """\
worker "w1" {}
worker "w2" {}
worker "w3" {}
job "a" {
  prefix   = "locks/a/"
  workers  = ["w1", "w3"]
  schedule = "@hourly"
  command  = ["/bin/true"]
}
"""


def test_all_with_a_worker_that_runs_no_job_writes_nothing(tmp_path: Path) -> None:
    spec = tmp_path / "locks.hcl"
    spec.write_text(IDLE)
    result = _cli(tmp_path / "out", "--config-dir", "/etc/lockctl", spec=spec)
    assert result.exit_code == 2, result.output
    assert "worker w2 runs no job in" in result.stderr
    assert not (tmp_path / "out").exists()
    named = runner.invoke(
        app,
        [
            "worker-config",
            "-w",
            "w1",
            "-w",
            "w3",
            "--spec",
            str(spec),
            "--out",
            str(tmp_path / "out"),
        ],
    )
    assert named.exit_code == 0, named.output
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["w1", "w3"]


def test_a_failing_check_leaves_the_old_files_and_nothing_else(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = load_spec(EXAMPLE)
    out = tmp_path / "out"
    write_worker_files(spec, ["worker-1", "worker-2", "worker-3"], out, TEMPLATES, PLACEMENT)
    before = _tree(out)
    from provision.workers import files as files_module

    real_load = files_module.load_worker_config

    def load_fails_for_worker_3(path: Path) -> object:
        if path.parent.name == "worker-3":
            raise InputError(f"{path}: broken")
        return real_load(path)

    monkeypatch.setattr(files_module, "load_worker_config", load_fails_for_worker_3)
    other = Placement(Path("/elsewhere"), Path("/elsewhere/secrets"), "/usr/bin/lockctl")
    with pytest.raises(InputError, match="broken"):
        write_worker_files(spec, ["worker-1", "worker-2", "worker-3"], out, TEMPLATES, other)
    assert _tree(out) == before  # worker-1 and worker-2 were not rewritten either
    assert sorted(p.name for p in out.iterdir()) == ["worker-1", "worker-2", "worker-3"]


def test_a_target_that_is_a_folder_stops_the_write_before_any_file_moves(tmp_path: Path) -> None:
    spec = load_spec(EXAMPLE)
    out = tmp_path / "out"
    (out / "worker-3" / "lockctl.env").mkdir(parents=True)  # in the way of the last worker
    with pytest.raises(InputError, match=r"--out .*: cannot write the worker files: .*lockctl.env"):
        write_worker_files(spec, ["worker-1", "worker-2", "worker-3"], out, TEMPLATES, PLACEMENT)
    assert sorted(str(p.relative_to(out)) for p in out.rglob("*")) == [
        "worker-3",
        "worker-3/lockctl.env",
    ]


def test_a_new_out_folder_is_not_left_behind_on_failure(tmp_path: Path) -> None:
    spec = load_spec(EXAMPLE)
    with pytest.raises(InputError):
        write_worker_files(
            spec,
            ["worker-1"],
            tmp_path / "a" / "b",
            TEMPLATES,
            Placement(Path("relative"), Path("/s"), "/usr/bin/lockctl"),
        )
    assert not list(tmp_path.iterdir())
    (tmp_path / "blocker").write_text("")
    with pytest.raises(InputError, match="cannot write the worker files"):
        write_worker_files(spec, ["worker-1"], tmp_path / "blocker", TEMPLATES, PLACEMENT)


# --- the timer's schedule --------------------------------------------------------------------


def test_the_timer_fires_on_the_schedule_lockctl_computes(tmp_path: Path) -> None:
    spec = parse_spec(
        'worker "worker-1" {}\njob "a" {\n  prefix = "locks/a/"\n  workers = ["worker-1"]\n'
        '  schedule = "0 12 13 * 5"\n  timezone = "Europe/Berlin"\n  command = ["/bin/true"]\n}\n',
        "s.hcl",
    )
    write_worker_files(spec, ["worker-1"], tmp_path, TEMPLATES, PLACEMENT)
    timer = (tmp_path / "worker-1/systemd/lockctl-a.timer").read_text()
    # cron ORs a restricted day-of-month and day-of-week: one OnCalendar= line each
    assert "OnCalendar=*-*-13 12:00:00 Europe/Berlin\n" in timer
    assert "OnCalendar=Fri *-*-* 12:00:00 Europe/Berlin\n" in timer
    assert timer.count("OnCalendar=") == 2


def test_the_tls_dir_puts_each_worker_s_files_in_its_config_and_env_file(tmp_path: Path) -> None:
    out = tmp_path / "out"
    result = _cli(out, "--tls-dir", "/etc/lockctl/tls")  # the example's agents speak https://
    assert result.exit_code == 0, result.output
    config = load_worker_config(out / "worker-2" / "lockctl.json")
    assert config.connection()["given"].client_cert == Path("/etc/lockctl/tls/worker-2.pem")
    env = (out / "worker-2" / "lockctl.env").read_text(encoding="utf-8").splitlines()
    assert env[-3:] == [
        "CONSUL_CACERT=/etc/lockctl/tls/ca.pem",
        "CONSUL_CLIENT_CERT=/etc/lockctl/tls/worker-2.pem",
        "CONSUL_CLIENT_KEY=/etc/lockctl/tls/worker-2-key.pem",
    ]
    plain = tmp_path / "plain"
    assert _cli(plain).exit_code == 0
    assert "CONSUL_CACERT" not in (plain / "worker-2" / "lockctl.env").read_text(encoding="utf-8")


def test_tls_files_for_a_plain_http_agent_are_refused_naming_the_spec_line(tmp_path: Path) -> None:
    spec = tmp_path / "plain.hcl"
    text = EXAMPLE.read_text(encoding="utf-8")
    spec.write_text(text.replace("https://127.0.0.22:8501", "http://127.0.0.22:8500"))
    result = _cli(tmp_path / "out", "--tls-dir", "/etc/lockctl/tls", spec=spec)
    assert result.exit_code == 2, result.output
    line = text.splitlines().index('worker "worker-2" {') + 1
    assert result.stderr.strip() == (
        f"lockctl: error: --tls-dir: {spec}:{line}: worker worker-2's address "
        "http://127.0.0.22:8500 is plain HTTP; give its agent's https:// address"
    )
    assert not (tmp_path / "out").exists()
