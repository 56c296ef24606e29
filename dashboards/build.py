"""The Grafana dashboard of `lockctl schedule --listen`, built with grafana-foundation-sdk.

`make dashboard` (python dashboards/build.py) writes dashboards/lockctl.json, which is committed;
tests/unit/test_dashboard_json.py checks it is what this builds now. Every query selects the jobs of
the `$job` variable and reads a Prometheus that scrapes the schedulers with `honor_labels: true`
(their `job` label is the spec's job, docs/alerts.md); each replica counts every tick of a job
once (run on one replica, skipped on the others), so the queries sum or take the max over the
workers as the alerting rules do (alerts/lockctl.rules.yml). docs/dashboard.md shows each panel.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path

from grafana_foundation_sdk.builders import dashboard as board
from grafana_foundation_sdk.builders import prometheus, statetimeline, table, timeseries
from grafana_foundation_sdk.cog.builder import Builder
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.cog.variants import Dataquery
from grafana_foundation_sdk.models import dashboard as model
from grafana_foundation_sdk.models.prometheus import PromQueryFormat

OUTPUT = Path(__file__).with_name("lockctl.json")
UID = "lockctl-schedule"
DATASOURCE = model.DataSourceRef(type_val="prometheus", uid="${datasource}")
JOBS = 'job=~"$job"'  # every query's selector: the jobs picked in the `job` variable
WINDOW = "$__rate_interval"  # Grafana's: at least four scrape intervals
WIDTH, HEIGHT = 12, 8  # two panels a row


@dataclass(frozen=True)
class Query:
    expr: str
    legend: str


def _quantiles(histogram: str) -> tuple[Query, ...]:
    """The median and the 95th percentile of a histogram of lockctl's, per job."""
    rate = f"sum by (job, le) (rate({histogram}_bucket{{{JOBS}}}[{WINDOW}]))"
    return tuple(
        Query(f"histogram_quantile({q}, {rate})", f"{{{{job}}}} p{round(q * 100)}")
        for q in (0.5, 0.95)
    )


def _increase(counter: str, by: str) -> str:
    """A counter's increase over the window, for the jobs picked, added up `by` these labels."""
    return f"sum by ({by}) (increase({counter}{{{JOBS}}}[{WINDOW}]))"


def _targets(queries: tuple[Query, ...], *, instant: bool = False) -> list[Builder[Dataquery]]:
    targets: list[Builder[Dataquery]] = []
    for ref, query in zip("ABCDEFGH", queries, strict=False):
        target = prometheus.Dataquery().expr(query.expr).legend_format(query.legend).ref_id(ref)
        target = target.datasource(DATASOURCE)
        targets.append(target.instant().format(PromQueryFormat.TABLE) if instant else target)
    return targets


def _timeseries(title: str, description: str, unit: str, *queries: Query) -> timeseries.Panel:
    panel = timeseries.Panel().title(title).description(description).unit(unit)
    panel = panel.datasource(DATASOURCE).span(WIDTH).height(HEIGHT)
    return panel.targets(_targets(queries))


def _states(
    title: str, description: str, query: Query, texts: dict[str, tuple[str, str]]
) -> statetimeline.Panel:
    """A state timeline whose values 0 and 1 read as words, each with its colour."""
    results = {
        value: model.ValueMappingResult(text=text, color=color, index=index)
        for index, (value, (text, color)) in enumerate(sorted(texts.items()))
    }
    panel = statetimeline.Panel().title(title).description(description)
    panel = panel.datasource(DATASOURCE).span(WIDTH).height(HEIGHT)
    return panel.mappings([model.ValueMap(options=results)]).targets(_targets((query,)))


def _thresholds(red_from: float) -> board.ThresholdsConfig:
    steps = [
        model.Threshold(value=None, color="green"),
        model.Threshold(value=red_from, color="red"),
    ]
    return board.ThresholdsConfig().mode(model.ThresholdsMode.ABSOLUTE).steps(steps)


def _tick_panels() -> list[Builder[model.Panel]]:
    return [
        _timeseries(
            "Age of the last success",
            "Seconds since the job last ended with exit status 0 on any replica.",
            "s",
            Query(
                f"time() - max by (job) (lockctl_job_last_success_timestamp_seconds{{{JOBS}}})",
                "{{job}}",
            ),
        ),
        _timeseries(
            "Ticks since the last success",
            "The age of the last success in the job's own intervals: the ticks since a success "
            "on any replica (the least over the replicas). 3 fires LockctlNoSuccess.",
            "none",
            Query(f"min by (job) (lockctl_ticks_since_success{{{JOBS}}})", "{{job}}"),
        ).thresholds(_thresholds(3)),
        _timeseries(
            "Ticks by outcome",
            "Each replica counts every tick once: `ran` on the replica that ran it, `skipped` "
            "on the others; `blackout` on every replica for a tick in a blackout window (not "
            "run, by design); `missed`, `consul-unavailable`, `error`, `lost`, `timed-out` "
            "(`job-timed-out` from replicas of the release before) and `interrupted` are the "
            "ones to look at.",
            "none",
            Query(_increase("lockctl_ticks_total", "job, outcome"), "{{job}} {{outcome}}"),
        ),
        _timeseries(
            "Skips by reason",
            "Why replicas skipped ticks: `taken` (another replica has it: the normal case), "
            "`overlap` (the previous run still goes on), `lock-delay`, `paused`, `blackout` "
            "(`lockctl run` at a tick in a blackout window), `other`.",
            "none",
            Query(_increase("lockctl_skips_total", "job, reason"), "{{job}} {{reason}}"),
        ),
        _timeseries(
            "Start lag",
            "From the tick's instant to its claim, for the runs that started (median, p95).",
            "s",
            *_quantiles("lockctl_start_lag_seconds"),
        ),
        _timeseries(
            "Run duration",
            "How long the runs held the lock, from the job's start to its end (median, p95).",
            "s",
            *_quantiles("lockctl_run_duration_seconds"),
        ),
        _timeseries(
            "Jobs running (at most one per job)",
            "Replicas running the job under its lock: 0 or 1; more fires LockctlJobRunningTwice.",
            "none",
            Query(f"sum by (job) (lockctl_job_running{{{JOBS}}})", "{{job}}"),
        ).thresholds(_thresholds(2)),
        _timeseries(
            "Run failures",
            "Runs that ended with a non-zero exit status, by the replica that ran them.",
            "none",
            Query(_increase("lockctl_run_failures_total", "job, worker"), "{{job}} on {{worker}}"),
        ),
        _timeseries(
            "Missed ticks",
            "Ticks nobody ran within their start deadline: recorded missed by a replica's "
            "housekeeping (each by one replica), or found too late by a replica's own loop.",
            "none",
            Query(_increase("lockctl_missed_ticks_recorded_total", "job"), "{{job}} recorded"),
            Query(
                f'max by (job) (increase(lockctl_ticks_total{{{JOBS}, outcome="missed"}}'
                f"[{WINDOW}]))",
                "{{job}} too late",
            ),
        ),
    ]


def _consul_panels() -> list[Builder[model.Panel]]:
    return [
        _timeseries(
            "Renew failures",
            "Renewals of a replica's session that Consul did not answer.",
            "none",
            Query(
                _increase("lockctl_renew_failures_total", "job, worker"), "{{job}} on {{worker}}"
            ),
        ),
        _states(
            "Consul reachability",
            "Whether Consul answered each replica's last request (for every job it runs).",
            Query(f"min by (worker) (lockctl_consul_up{{{JOBS}}})", "{{worker}}"),
            {"0": ("unreachable", "red"), "1": ("answers", "green")},
        ),
    ]


def _notification_panels() -> list[Builder[model.Panel]]:
    """The jobs' own notifications (docs/notifications.md) that did not get through: what
    LockctlNotificationFailing alerts on. Every result is at 0 from a scheduler's start, so a
    job with a notify block or a ping shows 0 until one fails."""
    undelivered = f'{JOBS},result=~"failed|dropped"'
    return [
        _timeseries(
            "Notifications not delivered",
            "Webhook posts and pings of each notify block (or the ping) that failed after their "
            "tries, or were dropped from a full queue.",
            "none",
            Query(
                f"sum by (job, notify, result) (increase(lockctl_notifications_total"
                f"{{{undelivered}}}[{WINDOW}]))",
                "{{job}} {{notify}} {{result}}",
            ),
        ),
    ]


def _schedule_panels() -> list[Builder[model.Panel]]:
    """What kube-state-metrics shows of a CronJob: its schedule, next time and suspension."""
    schedules = table.Panel().title("Schedules").datasource(DATASOURCE).span(WIDTH).height(HEIGHT)
    schedules = schedules.description("Each job's schedule and timezone, as the replicas run them.")
    schedules = schedules.targets(
        _targets(
            (
                Query(
                    f"max by (job, schedule, timezone) (lockctl_job_info{{{JOBS}}})",
                    "{{job}}",
                ),
            ),
            instant=True,
        )
    )
    return [
        schedules,
        _timeseries(
            "Time to the next tick",
            "Seconds until the job's next tick (below 0: no replica has planned it).",
            "s",
            Query(
                f"max by (job) (lockctl_job_next_tick_timestamp_seconds{{{JOBS}}}) - time()",
                "{{job}}",
            ),
        ),
        _states(
            "Paused",
            "Whether the job is paused (lockctl pause), as its replicas last saw its control keys.",
            Query(f"max by (job) (lockctl_job_paused{{{JOBS}}})", "{{job}}"),
            {"0": ("on schedule", "green"), "1": ("paused", "orange")},
        ),
    ]


def _variables() -> list[Builder[model.VariableModel]]:
    source = board.DatasourceVariable("datasource").label("Prometheus").type("prometheus")
    jobs = board.QueryVariable("job").label("Job").datasource(DATASOURCE)
    jobs = jobs.query("label_values(lockctl_ticks_total, job)").multi(True).include_all(True)
    jobs = jobs.all_value(".+").refresh(model.VariableRefresh.ON_TIME_RANGE_CHANGED)
    return [source, jobs.sort(model.VariableSort.ALPHABETICAL_ASC)]


def build_dashboard() -> model.Dashboard:
    """The dashboard, as the SDK's model."""
    built = board.Dashboard("lockctl").uid(UID).tags(["lockctl", "consul", "cron"])
    built = built.description("Jobs run by `lockctl schedule --listen`, once per tick.")
    built = built.time("now-1h", "now").refresh("30s").timezone("browser")
    built = built.tooltip(model.DashboardCursorSync.CROSSHAIR).variables(_variables())
    for title, panels in (
        ("Ticks", _tick_panels()),
        ("Consul", _consul_panels()),
        ("Schedules (as kube-state-metrics shows CronJobs)", _schedule_panels()),
        ("Notifications", _notification_panels()),  # last: the others' ids stay as they were
    ):
        built = built.with_row(board.Row(title))
        for panel in panels:
            built = built.with_panel(panel)
    dashboard = built.build()
    for number, shown in enumerate(dashboard.panels or (), start=1):
        shown.id_val = number  # stable ids: a panel's link survives a rebuild
    return dashboard


def dashboard_json() -> str:
    """The dashboard as the committed file holds it: sorted keys, two-space indent."""
    return json.dumps(build_dashboard(), cls=JSONEncoder, indent=2, sort_keys=True) + "\n"


def main() -> int:
    OUTPUT.write_text(dashboard_json())
    print(f"wrote {OUTPUT.name} ({len(build_dashboard().panels or ())} panels and rows)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
