"""`lockctl next JOB`: the coming ticks of a job's schedule, as lockctl itself computes them."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from typing import Annotated

import typer

from provision.cli import options
from provision.errors import InputError

JobName = Annotated[str, typer.Argument(help="The job whose ticks to show.")]
Count = Annotated[
    int, typer.Option("--count", "-n", min=1, max=1000, help="How many ticks to show.")
]
AsJson = Annotated[bool, typer.Option("--json", help="One JSON document instead of text.")]


def next_ticks(
    job: JobName,
    spec: options.SpecFile = options.DEFAULT_SPEC,
    count: Count = 5,
    as_json: AsJson = False,
) -> None:
    """Print the job's next ticks in UTC and in its timezone (no Consul needed)."""
    from provision.blackouts import holding_window
    from provision.durations import format_duration
    from provision.schedule import parse_schedule
    from provision.spec import load_spec

    loaded = load_spec(spec)
    found = [j for j in loaded.jobs if j.name == job]
    if not found:
        known = ", ".join(j.name for j in loaded.jobs) or "none"
        raise InputError(f"{spec}: no job {job!r} (jobs: {known})")
    if found[0].schedule is None:
        raise InputError(f"{spec}:{found[0].line}: job {job!r} has no schedule")
    schedule = parse_schedule(found[0].schedule, found[0].timezone)
    ticks = schedule.next_ticks(datetime.now(timezone.utc), count)
    rows = [(_utc(t), t.astimezone(schedule.tz).isoformat()) for t in ticks]
    windows = found[0].blackouts
    # a tick a blackout window holds is shown, marked: it will be recorded `blackout`, not run
    held = [holding_window(windows, t) for t in ticks]
    if as_json:
        listed = [
            {"utc": utc, "local": local, "blackout": None if w is None else w.name}
            for (utc, local), w in zip(rows, held, strict=True)
        ]
        data = {"job": job, "schedule": schedule.text, "timezone": schedule.zone, "ticks": listed}
        typer.echo(json.dumps(data, indent=2))
        return
    typer.echo(f"{job}: {schedule.text} ({schedule.zone})")
    for w in windows:
        length = format_duration(w.duration)
        said = f"  blackout {w.name}: {w.schedule.text} ({w.schedule.zone}) for {length}"
        typer.echo(said)
    for tick, (utc, _), window in zip(ticks, rows, held, strict=True):
        local = tick.astimezone(schedule.tz)
        mark = "" if window is None else f"  blackout: {window.name} (not run)"
        typer.echo(f"  {utc}  {local:%Y-%m-%d %H:%M:%S %a} {local.tzname()}{mark}")


def _utc(tick: datetime) -> str:
    return tick.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
