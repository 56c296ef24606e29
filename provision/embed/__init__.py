"""lockctl inside a Python app: its scheduled functions run once per tick across its replicas.

    from provision.embed import Locker
    locker = Locker.from_config("/etc/lockctl/lockctl.json")   # or Locker.from_env()

    @locker.singleton("cache-refresh")      # a job of the spec: its lock, schedule, timings
    def refresh(run):                       # run.tick, run.lock_index, run.lost, run.deadline
        publish(fetch(), fence=run.lock_index)

    outcome = refresh()                     # in every replica: ran here, or skipped and why

The names below are the stable API (docs/embedding.md). Importing this package loads no Typer,
rich or Jinja (an import contract in pyproject.toml, and tests/unit/test_embed_imports.py).
"""

from provision.embed.locker import Claim, Locker
from provision.embed.run import (
    EXIT_ON_LOST,
    Isolation,
    LockLost,
    OnLost,
    Run,
    RunOutcome,
    RunStopped,
)
from provision.outcomes import Outcome
from provision.runner.results import SkipReason

__all__ = [
    "EXIT_ON_LOST",
    "Claim",
    "Isolation",
    "LockLost",
    "Locker",
    "OnLost",
    "Outcome",
    "Run",
    "RunOutcome",
    "RunStopped",
    "SkipReason",
]
