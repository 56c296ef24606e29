"""The lockctl command line: parse flags, call the core, print results, map errors to exit codes.

No HTTP and no Jinja here. Each command is a few lines; the work happens in the core modules.
Exit codes (also in the README): 0 ok, 1 a check failed, 2 bad input, 3 Consul unavailable,
4 permission denied, 5 other Consul error, 6 local environment problem, 130 interrupted.
"""

from __future__ import annotations

from provision.cli import (
    acl,
    check,
    cluster,
    consul_binary,
    history,
    next,
    policies,
    run,
    status,
    verify,
    workers,
)
from provision.cli.app import app


def main() -> None:
    """Console-script entry point."""
    app(prog_name="lockctl")


app.add_typer(cluster.app, name="cluster")
app.command("install-consul")(consul_binary.install_consul)
app.command("render")(policies.render)
app.command("lint")(policies.lint)
app.command("bootstrap")(acl.bootstrap)
app.command("plan")(acl.plan)
app.command("apply")(acl.apply)
app.command("rotate")(acl.rotate)
app.command("worker-config")(workers.worker_config)
app.command("run", context_settings={"allow_interspersed_args": False})(run.run)
app.command("status")(status.status)
app.command("next")(next.next_ticks)
app.command("history")(history.history)
app.command("check")(check.check)
app.command("verify")(verify.verify)

__all__ = ["app", "main"]
