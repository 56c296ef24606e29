"""Hostile or careless input (issue 13, F): each class ends in one line, its exit code, bounded
time and memory, and nothing half-written. No cluster: nothing here gets as far as Consul.

The commands run as real processes (`python -m provision`) where today's code hung or grew
without bound, so a regression is a failed test with a timeout, not a stuck suite.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from provision.consul.settings import GivenSettings, normalize_address, resolve_settings
from provision.durations import DurationSyntaxError, format_duration, parse_duration
from provision.errors import InputError
from provision.spec import hcl_parse, load_spec
from provision.spec.hcl import MAX_NESTING, HclTooDeep
from provision.spec.hcl_parse import parse_hcl
from provision.workers.config import config_record, load_worker_config

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "policies" / "locks.hcl"
MEMORY_LIMIT = 3 << 29  # 1.5 GiB of address space: lockctl needs ~100 MiB of it


# `python -m provision ARGS` with its address space bounded first: a command that read /dev/zero
# whole would die of MemoryError (a traceback: a failed test) instead of taking the machine's.
_BOUNDED = (
    "import resource, runpy, sys; "
    f"resource.setrlimit(resource.RLIMIT_AS, ({MEMORY_LIMIT}, {MEMORY_LIMIT})); "
    "sys.argv[0] = 'lockctl'; runpy.run_module('provision', run_name='__main__')"
)


# A bound for a command that would never end (a FIFO read that blocks, /dev/zero read whole):
# any bound catches a hang, and a generous one holds on a machine loaded to a crawl (a Python
# start there has taken over 15 s). Not a speed target: those are benchmarks' (bench/).
HANG = 120.0


def lockctl(
    *args: str, cwd: Path, timeout: float = HANG, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """`lockctl ARGS` as a process of its own, with its memory and its time bounded."""
    return subprocess.run(
        [sys.executable, "-c", _BOUNDED, *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
        check=False,
    )


def assert_one_line(done: subprocess.CompletedProcess[str], code: int, *needles: str) -> None:
    """The documented exit code, and stderr one `lockctl: error:` line naming what is wrong."""
    assert done.returncode == code, done.stderr
    assert "Traceback" not in done.stderr
    lines = done.stderr.splitlines()
    assert lines[-1].startswith("lockctl: error: "), done.stderr
    for needle in needles:
        assert needle in done.stderr, done.stderr


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    """A folder with policies/locks.hcl, as a checkout has."""
    (tmp_path / "policies").mkdir()
    shutil.copy(EXAMPLE, tmp_path / "policies" / "locks.hcl")
    return tmp_path


# --- deep nesting ----------------------------------------------------------------------------


def _nested_workers(depth: int) -> str:
    return (
        'worker "w" {\n  address = "http://127.0.0.1:8500"\n}\n'
        f'job "j" {{\n  prefix  = "locks/j/"\n  workers = {"[" * depth}{"]" * depth}\n}}\n'
    )


def _nested_blocks(depth: int) -> str:
    return "".join("key_prefix {\n" for _ in range(depth)) + "}\n" * depth


@pytest.mark.parametrize("depth", [MAX_NESTING + 1, 3000, 100_000])
def test_deeply_nested_lists_in_a_spec_are_one_problem_at_file_and_line(
    checkout: Path, depth: int
) -> None:
    spec = checkout / "deep.hcl"
    spec.write_text(_nested_workers(depth))
    done = lockctl("render", "--spec", str(spec), "--out", "out", cwd=checkout)
    assert_one_line(done, 2, f"{spec}:6:", f"nested more than {MAX_NESTING} deep")
    assert not (checkout / "out").exists()


def test_deeply_nested_blocks_in_a_policy_are_a_finding_at_file_and_line(checkout: Path) -> None:
    policy = checkout / "deep.hcl"
    policy.write_text(_nested_blocks(2000))
    done = lockctl("lint", str(policy), cwd=checkout)
    assert done.returncode == 1, done.stderr  # lint's convention: what is wrong is a finding
    assert "Traceback" not in done.stderr
    assert f"{policy}:{MAX_NESTING + 1}: error: syntax: column 12: nested more than" in done.stdout


def test_nesting_up_to_the_limit_still_parses_and_brackets_in_strings_do_not_count() -> None:
    deep = "a = " + "[" * MAX_NESTING + "]" * MAX_NESTING + "\n"
    assert parse_hcl(deep).attributes[0].name == "a"
    quoted = 'b = "' + "[" * 500 + '" # ' + "{" * 500 + "\nc = <<EOT\n" + "(" * 500 + "\nEOT\n"
    assert [a.name for a in parse_hcl(quoted).attributes] == ["b", "c"]


def test_a_recursion_error_past_the_scan_is_the_same_one_line_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The scan is the limit; the parser's own recursion is still caught, never a traceback."""
    monkeypatch.setattr(hcl_parse, "_check_nesting", lambda text: None)
    with pytest.raises(HclTooDeep, match="nested more than"):
        parse_hcl("a = " + "[" * 5000 + "]" * 5000 + "\n")


def test_a_deeply_nested_worker_config_is_an_input_error(tmp_path: Path) -> None:
    config = tmp_path / "lockctl.json"
    config.write_text("[" * 200_000 + "]" * 200_000)
    with pytest.raises(InputError, match="nested too deep"):
        load_worker_config(config)


# --- files that are not regular files, and files that never end ------------------------------


@pytest.fixture
def fifo(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "spec.fifo"
    os.mkfifo(path)
    yield path


@pytest.mark.parametrize(
    ("source", "kind"),
    [("/dev/zero", "a character device"), ("fifo", "a FIFO"), ("folder", "a folder")],
)
def test_render_refuses_a_spec_that_is_not_a_regular_file(
    checkout: Path, fifo: Path, source: str, kind: str
) -> None:
    path = {"fifo": str(fifo), "folder": str(checkout)}.get(source, source)
    done = lockctl("render", "--spec", path, "--out", "out", cwd=checkout)
    assert_one_line(done, 2, f"spec {path}: cannot read: {kind}, not a regular file")
    assert not (checkout / "out").exists()


@pytest.mark.parametrize("command", ["lint", "worker-config", "run"])
def test_every_reader_refuses_a_fifo_and_dev_zero(checkout: Path, fifo: Path, command: str) -> None:
    for path in (str(fifo), "/dev/zero"):
        args = {
            "lint": ["lint", path],
            "worker-config": ["worker-config", "--spec", path, "--all", "--out", "out"],
            "run": ["run", "--job", "j", "--config", path, "--", "true"],
        }[command]
        done = lockctl(*args, cwd=checkout)
        assert_one_line(done, 2, path, "not a regular file")
    assert not (checkout / "out").exists()


def test_a_spec_larger_than_the_bound_is_refused_without_reading_all_of_it(checkout: Path) -> None:
    """A sparse file of 4 GiB: refused after 16 MiB + 1 byte, not read whole (the process may
    not even hold it: its memory is bounded)."""
    big = checkout / "big.hcl"
    with big.open("wb") as handle:
        handle.truncate(4 << 30)
    done = lockctl("render", "--spec", str(big), "--out", "out", cwd=checkout)
    assert_one_line(done, 2, f"{big}:1: file: is over 16777216 bytes; a spec may be at most")


# --- --out that is a file, or a folder no file can be written into ----------------------------


def _unwritable(tmp_path: Path) -> Path:
    """A folder this user cannot write into: root ignores mode bits, so /sys stands in."""
    if os.geteuid() != 0:
        folder = tmp_path / "read-only"
        folder.mkdir(mode=0o500)
        return folder
    if os.access("/sys", os.W_OK) and not _probe_fails(Path("/sys")):
        pytest.skip("no folder here that root cannot write")
    return Path("/sys")


def _probe_fails(folder: Path) -> bool:
    try:
        (folder / ".lockctl-test-probe").touch()
    except OSError:
        return True
    (folder / ".lockctl-test-probe").unlink()
    return False


@pytest.mark.parametrize("command", ["render", "worker-config"])
def test_out_that_is_a_file_is_refused_before_anything_is_written(
    checkout: Path, command: str
) -> None:
    out = checkout / "out"
    out.write_text("mine\n")
    args = ["render"] if command == "render" else ["worker-config", "--all"]
    done = lockctl(*args, "--out", str(out), cwd=checkout)
    assert_one_line(done, 6, f"--out {out}: is a file, not a folder")
    assert out.read_text() == "mine\n"


@pytest.mark.parametrize("command", ["render", "worker-config"])
def test_out_in_a_folder_that_cannot_be_written_is_refused(
    checkout: Path, tmp_path: Path, command: str
) -> None:
    out = _unwritable(tmp_path) / "lockctl-out"
    args = ["render"] if command == "render" else ["worker-config", "--all"]
    done = lockctl(*args, "--out", str(out), cwd=checkout)
    assert_one_line(done, 6, f"--out {out}: cannot write in {out.parent}")
    assert not out.exists()


def test_worker_config_checks_every_workers_folder_before_writing_any(checkout: Path) -> None:
    out = checkout / "out"
    (out / "worker-3").mkdir(parents=True)
    (out / "worker-3" / "systemd").write_text("in the way\n")
    done = lockctl("worker-config", "--all", "--out", str(out), cwd=checkout)
    assert_one_line(done, 6, f"--out {out / 'worker-3' / 'systemd'}: is a file, not a folder")
    assert sorted(p.name for p in out.iterdir()) == ["worker-3"]  # no worker-1, no worker-2
    assert sorted(p.name for p in (out / "worker-3").iterdir()) == ["systemd"]


# --- Consul addresses -------------------------------------------------------------------------

BAD_ADDRESSES = [
    ("http://[::1", "Invalid IPv6 URL"),
    ("http://[zz]:8500", "not scheme://host:port"),
    ("http://host:99999", "Port out of range"),
    ("http://host:0", "port must be 1..65535"),
    ("ftp://x", "scheme must be http or https"),
    ("http://:8500", "no host"),
    ("http://", "no host"),
    ("http://user:pw@host:8500", "no user@"),
    ("http://ho st:8500", "a space or a control character"),
    ("http://host\n:8500", "a space or a control character"),
    ("http://-host:8500", "host must be a name or an IP address"),
]


@pytest.mark.parametrize(("address", "why"), BAD_ADDRESSES)
def test_a_bad_address_is_an_input_error(address: str, why: str) -> None:
    with pytest.raises(InputError, match="Consul address") as caught:
        normalize_address(address)
    assert why in str(caught.value)
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize(
    "command",
    [["status"], ["plan"], ["apply"], ["rotate", "--worker", "worker-1"], ["verify"]],
    ids=lambda c: c[0],
)
def test_every_command_refuses_a_broken_address_in_one_line(
    checkout: Path, command: list[str]
) -> None:
    for address in ("http://[::1", "http://host:99999"):
        done = lockctl(*command, "--address", address, cwd=checkout)
        assert_one_line(done, 2, f"Consul address {address!r}")
    done = lockctl(*command, cwd=checkout, env={"CONSUL_HTTP_ADDR": "http://[::1"})
    assert_one_line(done, 2, "Consul address 'http://[::1'")


def test_run_refuses_a_broken_address_in_its_worker_config(tmp_path: Path) -> None:
    config = _worker_config(tmp_path, address="http://[::1")
    done = lockctl(
        "run", "--job", "nightly-ingest", "--config", str(config), "--", "true", cwd=tmp_path
    )
    assert_one_line(done, 2, "Consul address 'http://[::1'")


# --- durations and timeouts -----------------------------------------------------------------


@pytest.mark.parametrize("text", ["1" * 400 + "h", "99999999999h", "2562048h", "1" * 320 + "s1s"])
def test_absurd_durations_are_refused_not_turned_into_inf(text: str) -> None:
    with pytest.raises(DurationSyntaxError, match="out of range") as caught:
        parse_duration(text)
    assert len(str(caught.value)) < 120  # the text is cut short in the message


def test_the_longest_go_duration_parses_and_non_finite_seconds_still_format() -> None:
    assert parse_duration("2562047h").seconds == 2562047 * 3600
    assert format_duration(math.inf) == "inf"
    assert format_duration(math.nan) == "nan"


@pytest.mark.parametrize("timeout", [1e300, 3601.0, math.inf, math.nan, 0.0, -1.0])
def test_a_consul_timeout_out_of_bounds_is_an_input_error(timeout: float) -> None:
    with pytest.raises(InputError, match="--timeout"):
        resolve_settings(GivenSettings(timeout=timeout), env={})


def test_a_huge_consul_timeout_flag_is_refused_in_one_line(checkout: Path) -> None:
    done = lockctl("status", "--timeout", "1e300", "--address", "127.0.0.1:1", cwd=checkout)
    assert_one_line(done, 2, "--timeout 1e+300: must be above 0 and at most 3600")


def _worker_config(tmp_path: Path, *, address: str) -> Path:
    spec = load_spec(EXAMPLE)
    token = tmp_path / "worker-1.token"
    token.write_text("00000000-0000-0000-0000-000000000000\n")
    token.chmod(0o600)
    record = config_record(spec, "worker-1", token)
    record["consul"]["address"] = address
    config = tmp_path / "lockctl.json"
    config.write_text(json.dumps(record))
    return config


@pytest.fixture
def listener() -> Iterator[socket.socket]:
    """A loopback port that takes connections and records them, and never answers."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(16)
        server.setblocking(False)
        yield server


def _connections(server: socket.socket) -> int:
    count = 0
    while True:
        try:
            connection, _ = server.accept()
        except BlockingIOError:
            return count
        connection.close()
        count += 1


@pytest.mark.parametrize(
    ("flags", "needle"),
    [
        (["--min-hold", "1000000h"], "--min-hold 1000000h: must be at most 24h"),
        (["--min-hold", "24h0m1s"], "--min-hold 24h0m1s: must be at most 24h"),
        (["--min-hold", "1" * 400 + "s"], "out of range"),
        (["--wait", "--timeout", "100000h"], "--timeout 100000h: must be at most 168h"),
        (["--wait", "--timeout", "9e300s"], "is not a duration"),
    ],
)
def test_run_refuses_a_huge_duration_at_the_flag_before_any_lock(
    tmp_path: Path, listener: socket.socket, flags: list[str], needle: str
) -> None:
    port = listener.getsockname()[1]
    config = _worker_config(tmp_path, address=f"http://127.0.0.1:{port}")
    ran = tmp_path / "ran"
    done = lockctl(
        "run", "--job", "nightly-ingest", "--config", str(config), *flags,
        "--", "touch", str(ran),
        cwd=tmp_path,
    )  # fmt: skip
    assert_one_line(done, 2, needle)
    assert _connections(listener) == 0  # Consul was never asked: no session, no lock
    assert not ran.exists()


@pytest.mark.parametrize("source", ["fifo", "/dev/zero", "deep"])
def test_verify_refuses_an_inventory_that_is_not_a_regular_json_file(
    checkout: Path, fifo: Path, source: str
) -> None:
    deep = checkout / "deep.json"
    deep.write_text("[" * 200_000 + "]" * 200_000)
    path = {"fifo": str(fifo), "deep": str(deep)}.get(source, source)
    done = lockctl("verify", "--inventory", path, cwd=checkout)
    assert_one_line(done, 2, f"{path}: not a readable JSON inventory")


@pytest.mark.parametrize("address", ["http://[::1", "http://[zz]:8500"])
def test_a_broken_address_in_the_spec_is_a_problem_at_its_line(
    tmp_path: Path, address: str
) -> None:
    spec = tmp_path / "spec.hcl"
    spec.write_text(
        f'worker "w" {{\n  address = "{address}"\n}}\n'
        'job "j" {\n  prefix  = "locks/j/"\n  workers = ["w"]\n}\n'
    )
    with pytest.raises(InputError) as caught:
        load_spec(spec)
    (problem,) = caught.value.problems  # type: ignore[attr-defined]
    assert str(problem).startswith(f'{spec}:2: worker "w".address: "{address}" is not a URL')
