"""A hostile holder record on the real cluster: `lockctl status` and a skipping `lockctl run`
show it escaped, bounded and with its markup literal, and say that its claim is forged.

Anyone with write on a job's lock key writes the key's value. Here worker-2's own token takes
the lock through worker-2's agent (so Consul says the session is on node worker-2) and writes a
record claiming to be worker-1, full of terminal escapes (clear-screen, an OSC window title),
Rich markup, a CR, bidi overrides and 100 KB of padding.
"""

from __future__ import annotations

import contextlib
import json
import re
import subprocess
import unicodedata
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from workers_lab import minted_workers

from provision.consul.errors import ConsulError
from provision.system.secrets import Secret
from tests.lockctl_process import run_lockctl

if TYPE_CHECKING:
    from conftest import LiveCluster


WORKERS = ("worker-1", "worker-2")
FORGED_WORKER = "worker-1\x1b]0;pwned\x07[bold red]X[/]\r\u202eevil"  # OSC: the window title
HOSTILE_RECORD = {
    "worker": FORGED_WORKER,  # the session is on worker-2: this claim is forged
    "host": "\x1b[2J\x1b[H[link=https://example.invalid]h[/link]\x9b31m\x7f",  # clear screen
    "pid": "1\u2066\x1b[31m",  # a bidi isolate, a colour
    "job": "[blink]j[/blink]",
    "acquired_at": "2026-01-01T00:00:00+00:00" + "\x1b" * 10 + "p" * 100_000,
}
SHOWN_WORKER = "worker-1\\x1b]0;pwned\\x07[bold red]X[/]\\r\\u202eevil"  # as printed
OUTPUT_BOUND = 10_000  # characters: the 100 KB value must not come through
SGR = re.compile(r"\x1b\[[0-9;]*m")  # Rich's own colours, in a terminal


@dataclass(frozen=True)
class Lab:
    spec_path: Path
    job: str
    key: str
    configs: dict[str, Path]  # worker -> its lockctl.json
    secrets: tuple[str, ...] = field(repr=False)  # pytest prints a failing test's arguments
    cluster: LiveCluster


def _raw_controls(text: str) -> list[str]:
    """Characters that drive a terminal or reorder text; newlines end lines and are fine."""
    unsafe = {"Cc", "Cf", "Cs", "Zl", "Zp"}
    return [c for c in text if c != "\n" and unicodedata.category(c) in unsafe]


def _spec_text(cluster: LiveCluster, uid: str) -> str:
    lines = ["defaults {", '  ttl = "10s"', '  lock_delay = "4s"', '  renew_interval = "1s"']
    lines += ['  kill_grace = "1s"', "}"]
    for worker in WORKERS:
        lines += [f'worker "{worker}" {{', f'  address = "{cluster.address(worker)}"', "}"]
    lines += [f'job "hostile-{uid}" {{', f'  prefix  = "test/hostile-{uid}/"']
    lines += ['  workers = ["worker-1", "worker-2"]', "}"]
    return "\n".join(lines) + "\n"


@pytest.fixture(scope="module")
def lab(live_cluster: LiveCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    tmp = tmp_path_factory.mktemp("hostile")
    uid = uuid.uuid4().hex[:8]
    spec_path = tmp / "locks.hcl"
    spec_path.write_text(_spec_text(live_cluster, uid))
    kv = f"test/hostile-{uid}/"
    with minted_workers(live_cluster, spec_path, WORKERS, tmp, uid, kv) as made:
        yield Lab(
            spec_path=spec_path,
            job=f"hostile-{uid}",
            key=f"{kv}.lock",
            configs=made.configs,
            secrets=tuple(made.secrets),
            cluster=live_cluster,
        )


@pytest.fixture(scope="module")
def forged_session(lab: Lab) -> Iterator[str]:
    """worker-2's own token holds the lock, through worker-2's agent, claiming to be worker-1."""
    worker_2 = lab.cluster.client("worker-2", _worker_token(lab, "worker-2"))
    session = worker_2.session.create(name="hostile", ttl=120, lock_delay=0)
    try:
        value = json.dumps(HOSTILE_RECORD).encode()
        assert len(value) > 100_000
        assert worker_2.kv.put(lab.key, value, acquire=session)
        yield session
    finally:
        with contextlib.suppress(ConsulError):
            worker_2.session.destroy(session)


def _worker_token(lab: Lab, worker: str) -> Secret:
    config = json.loads(lab.configs[worker].read_text())
    return Secret(Path(config["consul"]["token_file"]).read_text().strip())


def lockctl(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return run_lockctl(*args, env=env, timeout=30, drop=("FORCE_COLOR", "NO_COLOR"))


def _status(lab: Lab, *flags: str, **env: str) -> subprocess.CompletedProcess[str]:
    connection = ["--address", lab.cluster.address("server-1")]
    connection += ["--token-file", str(lab.cluster.layout.management_token_file)]
    result = lockctl("status", "--spec", str(lab.spec_path), *connection, *flags, **env)
    assert result.returncode == 0, result.stderr
    _assert_no_secret(lab, result)
    return result


def _assert_no_secret(lab: Lab, result: subprocess.CompletedProcess[str]) -> None:
    for secret in lab.secrets:
        assert secret not in result.stdout and secret not in result.stderr


# --- status -------------------------------------------------------------------------------------


def test_status_json_escapes_bounds_and_flags_the_forged_claim(
    lab: Lab, forged_session: str
) -> None:
    result = _status(lab, "--json")
    assert _raw_controls(result.stdout) == [] and len(result.stdout) < OUTPUT_BOUND
    (state,) = [s for s in json.loads(result.stdout) if s["job"] == lab.job]
    assert state["held"] is True and state["session"] == forged_session
    assert state["node"] == "worker-2"  # Consul's word
    assert state["claim_matches_node"] is False  # the record says worker-1
    claims = state["claims"]
    assert claims["worker"] == SHOWN_WORKER
    assert claims["host"] == "\\x1b[2J\\x1b[H[link=https://example.invalid]h[/link]\\x9b31m\\x7f"
    assert claims["pid"] == "1\\u2066\\x1b[31m" and claims["job"] == "[blink]j[/blink]"
    assert claims["acquired_at"].startswith("2026-01-01T00:00:00+00:00\\x1b")
    assert claims["acquired_at"].endswith(" chars)")  # cut, and says so


def _row_cells(out: str, first_line: str, border: str = "│") -> list[str]:
    """The cells of the table row whose first line contains `first_line`, each joined across
    the lines it wraps onto, spaces removed (a folded cell loses a space where it wraps)."""
    lines = out.splitlines()
    first = next(i for i, line in enumerate(lines) if first_line in line)
    block = []
    for line in lines[first:]:
        if not line.startswith(border):
            break
        block.append(line.split(border)[1:-1])
    return ["".join("".join(row[i].split()) for row in block) for i in range(len(block[0]))]


def test_status_table_in_a_pipe_shows_the_record_as_written(lab: Lab, forged_session: str) -> None:
    out = _status(lab).stdout
    assert _raw_controls(out) == [] and len(out) < OUTPUT_BOUND, out
    job, key, holder, session, record, lock_index = _row_cells(out, lab.job)
    assert (job, key, session) == (lab.job, lab.key, forged_session)
    nospace = "".join(SHOWN_WORKER.split())
    assert holder == f"worker-2forged?claims{nospace}"  # the node holds it; the claim is flagged
    assert record.startswith(f"{nospace},host\\x1b[2J\\x1b[H[link=https://example.invalid]h[/link]")
    assert record.endswith(
        ",since2026-01-01T00:00:00+00:00\\x1b\\x1b\\x1b\\x1b\\x1b...(+100005chars)"
    )
    assert lock_index.isdigit()
    headers = _row_cells(out, "┃", border="┃")
    assert headers[2:5] == ["holder(node,fromConsul)", "session", "record(aswrittenbytheholder)"]


def test_status_table_in_a_terminal_has_only_rich_own_colours(
    lab: Lab, forged_session: str
) -> None:
    out = _status(lab, FORCE_COLOR="1", COLUMNS="200").stdout
    assert "\x1b[" in out  # Rich did colour it (the forged flag is bold red) ...
    plain = SGR.sub("", out)
    assert _raw_controls(plain) == [], plain  # ... and nothing else drives the terminal
    assert "\x1b]" not in out and "\x1b[2J" not in out and "\x1b[H" not in out
    assert len(plain) < OUTPUT_BOUND


# --- the skipped event ----------------------------------------------------------------------------


def _skipped(lab: Lab, config: Path) -> dict[str, Any]:
    result = lockctl("run", "--config", str(config), "--job", lab.job, "--", "true")
    assert result.returncode == 0, result.stderr
    _assert_no_secret(lab, result)
    assert _raw_controls(result.stderr) == [] and len(result.stderr) < OUTPUT_BOUND
    events = [json.loads(line) for line in result.stderr.splitlines() if line.startswith("{")]
    (skipped,) = [e for e in events if e["event"] == "skipped"]
    assert all(_raw_controls(str(value)) == [] for value in skipped.values())
    return dict(skipped)


def test_skipped_event_with_a_worker_token_marks_the_claim_unverified(
    lab: Lab, forged_session: str
) -> None:
    """worker-1's least-privilege token may not read worker-2's session: no node to vouch."""
    skipped = _skipped(lab, lab.configs["worker-1"])
    assert skipped["holder"] == forged_session
    assert "holder_node" not in skipped
    assert skipped["holder_claims"] == SHOWN_WORKER
    assert skipped["reason"].startswith("held by another session; its record claims worker ")
    assert skipped["reason"].endswith("(unverified)")


def test_skipped_event_with_session_read_names_the_node_and_flags_the_forgery(
    lab: Lab, forged_session: str, tmp_path: Path
) -> None:
    """A token that may read sessions (here the management token) learns the node."""
    config = json.loads(lab.configs["worker-1"].read_text())
    config["consul"]["token_file"] = str(lab.cluster.layout.management_token_file)
    path = tmp_path / "lockctl.json"
    path.write_text(json.dumps(config))
    skipped = _skipped(lab, path)
    assert skipped["holder"] == forged_session and skipped["holder_node"] == "worker-2"
    assert skipped["forged"] is True
    assert skipped["reason"].startswith(
        "held by node worker-2 (Consul's session info); its record claims worker worker-1\\x1b"
    )
    assert skipped["reason"].endswith(": forged?")
