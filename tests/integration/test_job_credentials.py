"""The job cannot act as the worker (issue 25, item 4), on the real TLS cluster: a job that runs
as the same user as lockctl tries to read the worker's token file and TLS client key (by the
paths in the worker's config) and to write its own job's prefix with them. Under `lockctl run`
(its one-shot namespace) and under `lockctl schedule` (the namespace helper): both files read
as empty, the environment names neither of them nor the config, and the write never reaches
Consul. Outside the job nothing changed: the files are intact, and the runner used them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from scheduler_lab import SchedulerProcess
from workers_lab import minted_workers

from tests.lockctl_process import LOCKCTL

if TYPE_CHECKING:
    from conftest import LiveCluster


WORKER = "worker-1"
WAIT = 30.0

# What the job tries, as an attacker that knows the config's paths would: read both files, look
# at its environment, and write the job's own prefix with the token it read and the client
# pair. Each finding goes to a file of its own; nothing of a secret is printed.
ATTEMPT = r"""
import json, os, ssl, sys, urllib.request
paths, out = json.loads(sys.argv[1]), sys.argv[2]
found = {"env": sorted(k for k in os.environ if k.startswith(("CONSUL_", "LOCKCTL_CONFIG")))}
for name in ("token_file", "key_file", "cert_file"):
    try:
        with open(paths[name], "rb") as f:
            found[name] = len(f.read())
    except OSError as exc:
        found[name] = f"unreadable: {exc.strerror}"
try:
    with open(paths["token_file"]) as f:
        token = f.read().strip()
    context = ssl.create_default_context(cafile=paths["ca_file"])
    context.load_cert_chain(paths["cert_file"], paths["key_file"])
    url = paths["address"] + "/v1/kv/" + paths["key"]
    ask = urllib.request.Request(url, data=b"the job was here", method="PUT")
    ask.add_header("X-Consul-Token", token)
    with urllib.request.urlopen(ask, context=context, timeout=5) as answer:
        found["write"] = answer.status
except Exception as exc:
    found["write"] = type(exc).__name__
with open(out + ".part", "w") as f:
    json.dump(found, f)
os.replace(out + ".part", out)  # whole, or not there
"""


@dataclass(frozen=True)
class Lab:
    tmp: Path
    config: Path
    paths: dict[str, str]  # the worker config's consul section, and the key the job writes
    plain: str
    ticking: str


@pytest.fixture(scope="module")
def lab(live_cluster: LiveCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    tmp = tmp_path_factory.mktemp("credentials")
    uid = uuid.uuid4().hex[:8]
    prefix = f"test/creds-{uid}"
    (tmp / "attempt.py").write_text(ATTEMPT)
    lines = [f'worker "{WORKER}" {{', f'  address = "{live_cluster.address(WORKER)}"', "}"]
    for name, schedule in (("plain", None), ("ticking", "@every 2s")):
        command = [sys.executable, str(tmp / "attempt.py"), "{paths}", str(tmp / f"{name}.json")]
        lines += [f'job "{name}-{uid}" {{', f'  prefix  = "{prefix}/{name}/"']
        lines += [f'  workers = ["{WORKER}"]']
        if schedule:
            lines += [f'  schedule = "{schedule}"', f"  command  = {json.dumps(command)}"]
        lines += ["}"]
    spec = tmp / "locks.hcl"
    spec.write_text("\n".join(lines) + "\n")
    with minted_workers(live_cluster, spec, [WORKER], tmp, uid, prefix) as made:
        config = made.configs[WORKER]
        raw = json.loads(config.read_text())
        assert {"token_file", "key_file", "cert_file"} <= set(raw["consul"])  # a TLS cluster
        paths = {**raw["consul"], "key": f"{prefix}/ticking/intruder"}
        # the scheduled job's command carries the paths (as the attacker would know them)
        for job in raw["jobs"].values():
            if job["command"]:
                job["command"][2] = json.dumps(paths)
        config.write_text(json.dumps(raw))
        yield Lab(tmp, config, paths, f"plain-{uid}", f"ticking-{uid}")


def _judge(lab: Lab, found_file: Path, consul_key: str, live_cluster: LiveCluster) -> None:
    found = json.loads(found_file.read_text())
    assert found["token_file"] == 0, found  # read as empty: nothing of the token
    assert found["key_file"] == 0 and found["cert_file"] == 0, found
    assert found["env"] == [] or set(found["env"]) <= {"CONSUL_CACERT"}, found
    assert found["write"] != 200, found
    entry, _ = live_cluster.management(WORKER).kv.get(consul_key)
    assert entry is None, entry  # the write never reached Consul
    # outside the job nothing was covered: the worker's files are whole
    for name in ("token_file", "key_file", "cert_file"):
        assert os.path.getsize(lab.paths[name]) > 0, name


def test_a_run_job_cannot_read_the_workers_secrets_or_reach_consul_with_them(
    lab: Lab, live_cluster: LiveCluster
) -> None:
    out = lab.tmp / "plain.json"
    env = {**os.environ, "LOCKCTL_CONFIG": str(lab.config)}  # the config by the environment
    env.update(CONSUL_CLIENT_CERT=lab.paths["cert_file"], CONSUL_CLIENT_KEY=lab.paths["key_file"])
    attempt = [sys.executable, str(lab.tmp / "attempt.py"), json.dumps(lab.paths), str(out)]
    done = subprocess.run(
        [*LOCKCTL, "run", "--job", lab.plain, "--", *attempt],
        capture_output=True,
        text=True,
        timeout=WAIT,
        env=env,
    )
    assert done.returncode == 0, done.stderr
    assert "cannot hide" not in done.stderr, done.stderr
    assert '"event":"released"' in done.stderr  # the runner itself used the token and the pair
    _judge(lab, out, lab.paths["key"], live_cluster)


def test_a_scheduled_job_cannot_read_the_workers_secrets_or_reach_consul_with_them(
    lab: Lab, live_cluster: LiveCluster
) -> None:
    out = lab.tmp / "ticking.json"
    scheduler = SchedulerProcess(lab.config)
    try:
        give_up_at = time.monotonic() + WAIT
        while not out.exists() and time.monotonic() < give_up_at:
            time.sleep(0.2)
        assert out.exists(), scheduler.lines
        assert scheduler.stop() == 0
    finally:
        scheduler.kill()
    assert not any("cannot hide" in line for line in scheduler.lines), scheduler.lines
    _judge(lab, out, lab.paths["key"], live_cluster)
