"""Login instead of a token file, on the real cluster (issue 23, item 3): the test suite is the
JWT issuer (an RSA key made here; tests/jwt_issuer.py), Consul really verifies the tokens.

Three `lockctl schedule` replicas whose configs name no token file log in, run each tick of
two jobs once, log in again when two thirds of the 1m max_token_ttl have passed, while one of
them runs a 30 s job, which is not disturbed, and log out on SIGTERM (no token of the auth
method is left in Consul). `lockctl run` logs in, runs the job, which cannot read the bearer
token, and logs out. Each refused login (unknown identity, expired JWT, wrong audience,
another key) is one line and exit 4. Every login token seen is registered as a Secret, so
scripts/scan-secrets looks for it in the output and on disk."""

from __future__ import annotations

import contextlib
import itertools
import json
import signal
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from scheduler_lab import SchedulerProcess
from workers_lab import MintedWorkers, minted_workers, spec_text

from provision.acl.render import render_policies
from provision.consul import Consul, ConsulError
from provision.consul.transport import Call
from provision.errors import EXIT_DENIED
from provision.spec import load_spec
from provision.system.secrets import Secret
from provision.system.templates import find_templates_dir
from tests.jwt_issuer import ISSUER, make_key, sign_jwt, write_jwt
from tests.lockctl_process import eventually, run_lockctl

if TYPE_CHECKING:
    from conftest import LiveCluster

WORKERS = ("worker-1", "worker-2", "worker-3")
NAMESPACE = "it-login"
STEADY, LONG = 3, 40  # seconds between ticks: a short job, and one that runs 30 s of its 40


@dataclass
class Lab:
    tmp: Path
    cluster: LiveCluster
    made: MintedWorkers
    method: str
    key: Path
    uid: str
    jobs: dict[str, str]
    logs: dict[str, Path]
    secrets: list[Secret] = field(default_factory=list, repr=False)

    @property
    def management(self) -> Consul:
        return self.cluster.management()

    def login_config(self, worker: str, jwt: str, name: str | None = None) -> Path:
        """The worker's config with consul.login (the JWT written to its own file) instead of
        consul.token_file."""
        bearer = self.tmp / "jwt" / (name or worker)
        bearer.parent.mkdir(exist_ok=True)
        write_jwt(bearer, jwt)
        raw = json.loads(self.made.configs[worker].read_text())
        del raw["consul"]["token_file"]
        raw["consul"]["login"] = {"auth_method": self.method, "bearer_token_file": str(bearer)}
        path = self.tmp / f"{name or worker}.json"
        path.write_text(json.dumps(raw))
        return path

    def jwt(self, worker: str, **options: Any) -> str:
        return sign_jwt(self.key, NAMESPACE, f"{worker}-{self.uid}", **options)

    def login_tokens(self) -> list[str]:
        """The accessors of the auth method's tokens in Consul; each one's secret is read and
        kept as a Secret (scripts/scan-secrets then searches the output for it)."""
        path = "/v1/acl/tokens"
        listed = self.management.transport.request(
            Call("GET", path, params={"authmethod": self.method})
        )
        accessors = [str(token["AccessorID"]) for token in listed.body or ()]
        for accessor in accessors:
            with contextlib.suppress(ConsulError):  # logged out meanwhile
                secret = self.management.acl.read_token(accessor).secret
                if secret is not None:
                    self.secrets.append(secret)
        return accessors


def _command(log: Path, sleep: str) -> str:
    line = 'echo "$LOCKCTL_TICK $LOCKCTL_WORKER $(date +%s.%N)'
    return json.dumps(
        ["/bin/sh", "-c", f'{line} start" >> {log}; sleep {sleep}; {line} end" >> {log}']
    )


@pytest.fixture(scope="module")
def lab(live_cluster: LiveCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    tmp = tmp_path_factory.mktemp("login")
    uid = uuid.uuid4().hex[:8]
    logs = {"steady": tmp / "steady.log", "long": tmp / "long.log", "run": tmp / "run.log"}
    jobs = {
        f"steady-{uid}": {
            "schedule": f'"@every {STEADY}s"',
            "command": _command(logs["steady"], "0.2"),
        },
        f"long-{uid}": {"schedule": f'"@every {LONG}s"', "command": _command(logs["long"], "30")},
        f"run-{uid}": {},
    }
    for name, attributes in jobs.items():
        attributes["prefix"] = f'"test/login-{uid}/{name}/"'
    spec_path = tmp / "locks.hcl"
    spec_path.write_text(spec_text(live_cluster, WORKERS, jobs))
    key, public = make_key(tmp)
    method = f"login-{uid}"
    with minted_workers(live_cluster, spec_path, WORKERS, tmp, uid, f"test/login-{uid}/") as made:
        management = live_cluster.management()
        role_ids = []
        try:
            management.identity.create_auth_method(_auth_method(method, public))
            rendered = render_policies(load_spec(spec_path), find_templates_dir())
            for plan in rendered.tokens:  # each worker's role: its token's policies
                names = [made.policy_names[name] for name in plan.policies]
                role = management.identity.create_role(f"login-{plan.worker}-{uid}", "", names)
                role_ids.append(role.id)
                selector = (
                    f'value.namespace == "{NAMESPACE}" and '
                    f'value.service_account == "{plan.worker}-{uid}"'
                )
                management.identity.create_binding_rule(method, "", selector, role.name)
            yield Lab(
                tmp, live_cluster, made, method, key, uid, {s: f"{s}-{uid}" for s in logs}, logs
            )
        finally:
            with contextlib.suppress(ConsulError):  # its binding rules and tokens go with it
                management.identity.delete_auth_method(method)
            for role_id in role_ids:
                with contextlib.suppress(ConsulError):
                    management.identity.delete_role(role_id)


def _auth_method(name: str, public: Path) -> dict[str, Any]:
    return {
        "Name": name,
        "Type": "jwt",
        "MaxTokenTTL": "1m",  # Consul's least: a re-login at 40 s
        "Config": {
            "JWTValidationPubKeys": [public.read_text()],
            "BoundIssuer": ISSUER,
            "BoundAudiences": ["consul"],
            "ClaimMappings": {
                "/kubernetes.io/namespace": "namespace",
                "/kubernetes.io/serviceaccount/name": "service_account",
            },
        },
    }


def _runs(log: Path) -> list[tuple[str, str, float, float]]:
    """(tick, worker, start, end) per finished run, from the job's own log."""
    starts: dict[tuple[str, str], float] = {}
    runs = []
    for line in log.read_text().splitlines() if log.exists() else []:
        tick, worker, moment, what = line.split()
        if what == "start":
            starts[(tick, worker)] = float(moment)
        else:
            runs.append((tick, worker, starts[(tick, worker)], float(moment)))
    return sorted(runs, key=lambda run: run[2])


def _at(event: dict[str, Any]) -> float:
    return datetime.fromisoformat(str(event["time"])).timestamp()


def _contiguous(ticks: list[str], every: int) -> bool:
    moments = sorted(datetime.fromisoformat(t.replace("Z", "+00:00")).timestamp() for t in ticks)
    return all(b - a == every for a, b in itertools.pairwise(moments))


@pytest.fixture
def schedulers() -> Iterator[list[SchedulerProcess]]:
    started: list[SchedulerProcess] = []
    yield started
    for scheduler in started:
        scheduler.kill()


def test_three_schedulers_log_in_relogin_mid_run_and_log_out_on_sigterm(
    lab: Lab, schedulers: list[SchedulerProcess]
) -> None:
    configs = {}
    for worker in WORKERS:
        raw = json.loads(lab.login_config(worker, lab.jwt(worker, lifetime=3600)).read_text())
        raw["jobs"] = {k: v for k, v in raw["jobs"].items() if not k.startswith("run-")}
        configs[worker] = lab.tmp / f"{worker}-schedule.json"
        configs[worker].write_text(json.dumps(raw))
    # Start 3-6 s into a long tick: one replica runs that tick at once (late, within its start
    # deadline) for 30 s, over before the next tick; the next runs from 40 s on, for 30 s; the
    # re-login comes 40 s after the start (43-50 s after the first tick, a replica's start and
    # its login included), so within that second run, whichever replica runs it.
    assert eventually(lambda: 3 <= time.time() % LONG <= 6, timeout=LONG + 5, pause=0.2)
    for worker in WORKERS:
        schedulers.append(SchedulerProcess(configs[worker]))
    assert eventually(lambda: all(s.events("login") for s in schedulers)), [
        s.lines for s in schedulers
    ]
    assert len(eventually(lab.login_tokens)) == 3  # one token per replica, each registered
    relogged = eventually(lambda: all(len(s.events("login")) >= 2 for s in schedulers), timeout=70)
    assert relogged, [s.lines for s in schedulers]
    lab.login_tokens()  # the new ones, registered too
    relogins = [_at(s.events("login")[1]) for s in schedulers]

    def spanned() -> list[tuple[str, str, float, float]]:
        return [r for r in _runs(lab.logs["long"]) if r[2] < min(relogins) and r[3] > max(relogins)]

    assert eventually(spanned, timeout=40), (relogins, _runs(lab.logs["long"]))
    stop_at = time.time()
    assert [s.stop() for s in schedulers] == [0, 0, 0], [s.lines for s in schedulers]

    for scheduler in schedulers:
        logins = scheduler.events("login")
        assert [e["ttl_ms"] for e in logins[:2]] == [60000, 60000]
        outs = [(e["accessor"], e["reason"]) for e in scheduler.events("logout")]
        assert outs[0] == (logins[0]["accessor"], "relogin")
        assert outs[-1] == (logins[-1]["accessor"], "stop")  # SIGTERM: the last one goes
        for bad in (
            "login-refused",
            "login-failed",
            "logout-failed",
            "lost",
            "fenced",
            "renew-failed",
        ):
            assert not scheduler.events(bad), scheduler.lines
        assert not any("Traceback" in line for line in scheduler.lines)
    assert lab.login_tokens() == []  # nothing of the auth method is left in Consul
    for job, every in (("steady", STEADY), ("long", LONG)):
        runs = _runs(lab.logs[job])
        ticks = [tick for tick, _, _, _ in runs]
        assert len(ticks) == len(set(ticks)), runs  # each tick once
        assert _contiguous(ticks, every), ticks  # none missed, across the re-login too
    steady = [r for r in _runs(lab.logs["steady"]) if r[2] > max(relogins)]
    # ticks ran on the new tokens before the stop (a replica still up while the first ones
    # stop may run one more tick, ending after stop_at: not what this asks)
    assert any(end < stop_at for _, _, _, end in steady), (stop_at, steady)


def test_run_logs_in_runs_a_job_that_cannot_read_the_jwt_and_logs_out(lab: Lab) -> None:
    config = lab.login_config("worker-2", lab.jwt("worker-2"), name="run-worker-2")
    bearer = lab.tmp / "jwt" / "run-worker-2"
    probe = f"wc -c < {bearer}; env | grep -c -e LOCKCTL_BEARER -e CONSUL_HTTP_TOKEN; true"
    result = run_lockctl(
        "run",
        "--config",
        str(config),
        "--job",
        lab.jobs["run"],
        "--",
        "/bin/sh",
        "-c",
        probe,
        drop=("CONSUL_",),
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["0", "0"]  # the file reads empty; no variable names it
    events = [json.loads(line) for line in result.stderr.splitlines() if line.startswith("{")]
    names = [e["event"] for e in events]
    assert names[0] == "login" and "acquired" in names and names[-1] == "logout", names
    assert events[-1]["accessor"] == events[0]["accessor"]
    assert lab.login_tokens() == []
    assert bearer.read_text().count(".") == 2  # the runner's own copy was never touched


@pytest.mark.parametrize(
    ("case", "expected"),
    [
        ("unknown-identity", "(403): Permission denied (no binding rule selects the JWT's claims)"),
        (
            "expired",
            "(500): error validating claims: square/go-jose/jwt: validation failed, token is "
            "expired (exp)",
        ),
        ("audience", "(500): error validating claims: aud claim does not match any bound audience"),
        ("other-key", "(500): no known key successfully validated the token signature"),
    ],
)
def test_each_refused_login_is_one_line_naming_consuls_reason_and_exit_4(
    lab: Lab, case: str, expected: str
) -> None:
    other_key = lab.tmp / "other.key"
    if case == "other-key" and not other_key.exists():
        make_key(lab.tmp, "other")
    jwts = {
        "unknown-identity": lambda: sign_jwt(lab.key, NAMESPACE, f"stranger-{lab.uid}"),
        "expired": lambda: lab.jwt("worker-1", lifetime=60, issued_ago=600),
        "audience": lambda: lab.jwt("worker-1", audience="vault"),
        "other-key": lambda: sign_jwt(other_key, NAMESPACE, f"worker-1-{lab.uid}"),
    }
    config = lab.login_config("worker-1", jwts[case](), name=f"refused-{case}")
    result = run_lockctl(
        "run", "--config", str(config), "--job", lab.jobs["run"], "--", "true", drop=("CONSUL_",)
    )
    assert result.returncode == EXIT_DENIED, result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, lines
    assert lines[0] == (
        f"lockctl: error: login through auth method '{lab.method}' refused {expected}"
    ), lines


def _verify_spec(lab: Lab) -> Path:
    """The lab's spec with its auth method and each worker's identity, for `lockctl verify`."""
    text = (lab.tmp / "locks.hcl").read_text()
    for worker in WORKERS:
        identity = (
            f'  identity {{\n    auth_method = "{lab.method}"\n    claims {{\n'
            f'      namespace = "{NAMESPACE}"\n      service_account = "{worker}-{lab.uid}"\n'
            "    }\n  }\n"
        )
        text = text.replace(f'worker "{worker}" {{\n', f'worker "{worker}" {{\n{identity}', 1)
    method = (
        f'auth_method "{lab.method}" {{\n  type = "jwt"\n  bound_issuer = "{ISSUER}"\n'
        '  bound_audiences = ["consul"]\n  jwt_validation_pub_keys_file = "issuer.pem"\n'
        '  max_token_ttl = "1m"\n  claim_mappings {\n'
        '    namespace = "/kubernetes.io/namespace"\n'
        '    service_account = "/kubernetes.io/serviceaccount/name"\n  }\n}\n'
    )
    path = lab.tmp / "verify.hcl"
    path.write_text(method + text)
    return path


def test_verify_proves_a_login_gets_exactly_its_workers_rights(lab: Lab) -> None:
    spec = _verify_spec(lab)
    given = {"worker-1": lab.jwt("worker-1"), "worker-3": lab.jwt("worker-3")}
    given["stranger"] = sign_jwt(lab.key, NAMESPACE, f"stranger-{lab.uid}")
    flags = []
    for name, jwt in given.items():
        write_jwt(lab.tmp / "jwt" / f"verify-{name}", jwt)
        flags += ["--bearer-token-file", f"{name}={lab.tmp / 'jwt' / f'verify-{name}'}"]
    checks = ["--only", "login-confined", "--only", "login-refused", "--only", "login-expiry"]
    connection = ["--address", lab.cluster.address("server-1"), *lab.cluster.tls_flags()]
    base = ["verify", "--spec", str(spec), *connection, *checks, "--json"]
    result = run_lockctl(*base, *flags, drop=("CONSUL_",))
    assert result.returncode == 0, result.stdout + result.stderr
    report = {c["name"]: c for c in json.loads(result.stdout)["checks"]}
    assert {name: c["status"] for name, c in report.items()} == dict.fromkeys(report, "pass")
    confined = "\n".join(report["login-confined"]["evidence"])
    assert "worker-1 (login): session create on worker-2 -> 403" in confined
    refused = report["login-refused"]["evidence"]
    assert len(refused) == 3 and "stranger's JWT -> 403 Permission denied" in refused[-1]
    assert all("no known key successfully validated" in line for line in refused[:2])
    assert "lives 60.0 s" in report["login-expiry"]["evidence"][0]
    assert lab.login_tokens() == []  # verify logged out what it logged in
    without = run_lockctl(*base, drop=("CONSUL_",))
    skipped = {c["name"]: c for c in json.loads(without.stdout)["checks"]}
    assert {c["status"] for c in skipped.values()} == {"skip"}, without.stdout
    assert "give --bearer-token-file WORKER=FILE" in skipped["login-confined"]["summary"]


def test_a_reload_to_a_refused_login_is_refused_and_the_old_login_kept(
    lab: Lab, schedulers: list[SchedulerProcess]
) -> None:
    config = lab.login_config("worker-2", lab.jwt("worker-2"), name="reload-worker-2")
    raw = json.loads(config.read_text())
    raw["jobs"] = {k: v for k, v in raw["jobs"].items() if k.startswith("steady-")}
    config.write_text(json.dumps(raw))
    scheduler = SchedulerProcess(config)
    schedulers.append(scheduler)
    assert eventually(lambda: scheduler.events("started")), scheduler.lines
    stranger = lab.tmp / "jwt" / "reload-stranger"
    write_jwt(stranger, sign_jwt(lab.key, NAMESPACE, f"stranger-{lab.uid}"))
    raw["consul"]["login"]["bearer_token_file"] = str(stranger)
    config.write_text(json.dumps(raw))
    scheduler.process.send_signal(signal.SIGHUP)
    refused = eventually(lambda: scheduler.events("reload-refused"))
    assert refused and "refused (403): Permission denied" in refused[0]["error"], scheduler.lines
    assert len(scheduler.events("login")) == 1  # the old login stands
    ran = len(scheduler.events("released"))
    assert eventually(
        lambda: len(scheduler.events("released")) > ran or len(lab.login_tokens()) == 1
    )
    assert scheduler.stop() == 0
    assert lab.login_tokens() == []
