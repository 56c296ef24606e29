"""The entry point: preflight, the flow with its undo stack, the teardown, the report.

    PYTHONPATH=vagrant .venv/bin/python -m flow      (scripts/vagrant-verify, as root)

Exit status: 0 passed; 1 a step, the checks, the teardown or the secret check failed; 2 bad
settings; 6 not root, no .venv, or a libvirtd already running here; 130 SIGINT or SIGTERM.
"""

from __future__ import annotations

import os
import shutil
import sys
import traceback
from pathlib import Path

from flow import artifacts
from flow.commands import FlowFailed, output_teed_to
from flow.phases import PhaseTimer, phase_table
from flow.settings import Settings, SettingsError
from flow.steps import Flow
from flow.teardown import Interrupted, SignalGuard, UndoStack

REPO = Path(__file__).resolve().parents[2]


def main() -> int:
    os.environ.pop("PYTHONPATH", None)  # for this process only: its children need no vagrant/
    if os.geteuid() != 0:
        print("vagrant-verify: needs root (namespace, libvirtd)", file=sys.stderr)
        return 6
    try:
        settings = Settings.from_environment(REPO, os.environ)
    except SettingsError as problem:
        print(f"vagrant-verify: {problem}", file=sys.stderr)
        return 2
    if settings.workers < 2:
        print("vagrant-verify: needs VAGRANT_WORKERS >= 2", file=sys.stderr)
        return 2
    settings.export(os.environ)
    fresh_artifacts(settings)
    sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]
    with output_teed_to(settings.art / "flow.log"), SignalGuard().installed() as guard:
        return run_and_tear_down(settings, guard)


def fresh_artifacts(settings: Settings) -> None:
    for folder in (settings.run, settings.stage, settings.logs):
        shutil.rmtree(folder, ignore_errors=True)
    artifacts.reset(settings.art)
    settings.logs.mkdir(parents=True)
    settings.run.mkdir(mode=0o700)  # secrets and SSH keys live here during the run
    settings.run.chmod(0o700)


class SecretCheck:
    """The end-of-run search for the run's secrets (tokens, TLS private keys, the gossip key), as
    an undo: after everything else is torn down, before the run's state and the stage (where the
    secrets are) are removed."""

    passed = True

    def __init__(self, settings: Settings) -> None:
        self.settings = settings

    def __call__(self) -> None:
        s = self.settings
        self.passed = artifacts.check_no_secret_kept(s.art, s.secrets, s.tls_dir)


def run_and_tear_down(settings: Settings, guard: SignalGuard) -> int:
    timer = PhaseTimer(settings.art / "phases.txt")
    stack = UndoStack()
    stack.push("remove this run's state", lambda: remove_run_state(settings))
    secret_check = SecretCheck(settings)
    stack.push("search what the run keeps for its secrets", secret_check)
    status = 1
    try:
        try:
            with guard.raise_within():
                Flow(settings, timer, stack).run()
            status = 0
        except FlowFailed as failure:
            print(f"vagrant-verify: {failure}", file=sys.stderr)
            status = failure.status
        except Interrupted as interrupted:
            print(f"vagrant-verify: {interrupted}: stopping", file=sys.stderr)
            status = 130
        except Exception:  # a bug of the flow: the teardown still runs
            traceback.print_exc()
    finally:
        timer.start("teardown")
        left = stack.unwind()
        timer.end()
    return finish(settings, timer, status, left, secret_check.passed)


def remove_run_state(settings: Settings) -> None:
    for folder in (settings.run, settings.stage):
        shutil.rmtree(folder, ignore_errors=True)


def finish(
    settings: Settings, timer: PhaseTimer, status: int, left: list[str], no_secret_kept: bool
) -> int:
    art = settings.art
    if left:
        artifacts.append_report(art, "teardown: LEFT BEHIND: " + "; ".join(left))
    else:
        print("teardown: no VM, network, volume, pool, daemon or namespace of this run is left")
    if status == 0 and (left or not no_secret_kept):
        status = 1
    artifacts.append_report(art, "")
    artifacts.append_report(
        art,
        f"phase times ({settings.servers} servers + {settings.workers} workers,"
        f" {settings.memory} MB, {settings.cpus} vCPU each):",
    )
    for line in phase_table(timer.text()):
        artifacts.append_report(art, line)
    summary = artifacts.build_summary(status, settings.servers, settings.workers, timer.text(), art)
    artifacts.write_summary(art, summary)
    print("artifacts: .lockctl/vagrant/ (report.txt, verify.xml, ticks.json, summary.json, logs/)")
    print("vagrant-verify: PASSED" if status == 0 else f"vagrant-verify: FAILED (exit {status})")
    return status
