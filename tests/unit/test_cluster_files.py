"""The local cluster without agents: `up --workers 0` is refused, and `down` deletes only what
lockctl made in the state folder (the real-cluster version is in tests/integration)."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from provision.cli import app
from provision.cluster.layout import MAX_WORKERS, default_layout, save_layout
from provision.cluster.local import cluster_down

runner = CliRunner()


def test_up_with_zero_workers_is_refused_and_makes_nothing(tmp_path: Path) -> None:
    state_dir = tmp_path / "state"
    for count in ("0", "-1", str(MAX_WORKERS + 1)):
        result = runner.invoke(
            app, ["cluster", "up", "--state-dir", str(state_dir), "--workers", count]
        )
        assert result.exit_code == 2, result.output
        assert result.stderr == f"lockctl: error: --workers {count}: must be 1..{MAX_WORKERS}\n"
        assert not state_dir.exists()


def _fake_cluster(state_dir: Path, outside: Path) -> None:
    """A stopped cluster's folder as `up` leaves it (no agent runs, so nothing is signalled)."""
    layout = default_layout(state_dir, "127.0.250", 2)
    state_dir.mkdir(mode=0o700)
    save_layout(layout)
    (state_dir / "management.token").write_text("not a real secret\n")
    (state_dir / ".cluster.json.x1y2.tmp").write_text("{")  # an interrupted atomic write
    for agent in layout.agents:
        layout.data_dir(agent).mkdir(parents=True)
        (layout.data_dir(agent) / "raft.db").write_text("")
        for path in (layout.pidfile(agent), layout.config_file(agent), layout.log_file(agent)):
            path.write_text("")
    # A data folder that is a symlink out of the state folder: removed, never followed.
    outside.mkdir()
    (outside / "precious").write_text("keep")
    worker_2_data = layout.data_dir(layout.workers[1])
    (worker_2_data / "raft.db").unlink()
    worker_2_data.rmdir()
    worker_2_data.symlink_to(outside)


def test_down_deletes_only_what_lockctl_made(tmp_path: Path) -> None:
    state_dir = tmp_path / "state"
    _fake_cluster(state_dir, tmp_path / "outside")
    (state_dir / "notes.txt").write_text("mine")
    (state_dir / "worker-1" / "debug.txt").write_text("mine too")
    (state_dir / "mine").mkdir()

    result = cluster_down(state_dir)

    assert result.stopped == ()
    left = sorted(str(p.relative_to(state_dir)) for p in state_dir.rglob("*"))
    assert left == ["mine", "notes.txt", "worker-1", "worker-1/debug.txt"]
    assert result.kept == tuple(
        state_dir.absolute() / name for name in ("mine", "notes.txt", "worker-1/debug.txt")
    )
    assert (tmp_path / "outside" / "precious").read_text() == "keep"


def test_down_without_user_files_removes_the_folder(tmp_path: Path) -> None:
    state_dir = tmp_path / "state"
    _fake_cluster(state_dir, tmp_path / "outside")
    result = runner.invoke(app, ["cluster", "down", "--state-dir", str(state_dir)])
    assert result.exit_code == 0, result.output
    assert result.stdout == f"stopped: nothing was running; removed {state_dir}\n"
    assert not state_dir.exists()
    assert (tmp_path / "outside" / "precious").exists()


def test_down_names_what_it_kept(tmp_path: Path) -> None:
    state_dir = tmp_path / "state"
    _fake_cluster(state_dir, tmp_path / "outside")
    (state_dir / "notes\x1b[2J.txt").write_text("mine")
    result = runner.invoke(app, ["cluster", "down", "--state-dir", str(state_dir)])
    assert result.exit_code == 0, result.output
    assert result.stdout == (
        f"stopped: nothing was running; removed what lockctl made in {state_dir}, kept what it "
        "did not make: notes?[2J.txt\n"
    )
