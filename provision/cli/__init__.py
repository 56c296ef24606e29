"""The lockctl command line: parse flags, call the core, print results, map errors to exit codes.

No HTTP and no Jinja here. Each command is a few lines; the work happens in the core modules.
Exit codes (also in docs/reference.md): 0 ok, 1 a check failed, 2 bad input, 3 Consul unavailable,
4 permission denied, 5 other Consul error, 6 local environment problem, 130 interrupted.

Importing this package loads nothing else: the console script (entry.main) serves `lockctl run`
and `lockctl schedule` without Typer. `provision.cli.app` (the module) holds the Typer app with
every command; `from provision.cli import app` gives that app, loaded when first asked for.
"""

from __future__ import annotations

import sys
import types
from typing import Any


def main() -> None:
    """Console-script entry point (also `python -m provision`)."""
    from provision.cli.entry import main as entry_main

    entry_main()


class _CliPackage(types.ModuleType):
    """The package, whose `app` is the Typer app, loaded lazily.

    A property, not a module `__getattr__`: importing the submodule provision.cli.app makes
    the import system set the package's `app` to that module, which would then win.
    """

    @property
    def app(self) -> Any:
        from provision.cli.app import app

        return app

    @app.setter
    def app(self, _module: Any) -> None:
        pass  # the import system recording the submodule: it stays in sys.modules


sys.modules[__name__].__class__ = _CliPackage

__all__ = ["app", "main"]
