"""Which datacenters an operator's command reads or writes a job's keys in (a pure choice from
the spec, the job and --datacenter), its flag's errors, a datacenter that fails said on its
own, and the client bound to a datacenter asking its KV with `?dc=`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import responses
from typer.testing import CliRunner

from provision.cli.app import app
from provision.cli.datacenters import DatacentersFailed, in_each
from provision.consul import Consul, ConsulSettings
from provision.consul.errors import ConsulUnavailable
from provision.errors import EXIT_INPUT, EXIT_PARTIAL, InputError
from provision.spec import Spec, load_spec
from provision.spec.datacenters import chosen_datacenters

WORKERS = {"w-east": "dc1", "w-west": "dc2", "w-west-2": "dc2"}
JOBS = {  # name: (workers, scope)
    "both": (["w-east", "w-west"], "datacenter"),
    "west": (["w-west", "w-west-2"], None),  # its workers are in one datacenter: no scope
}


def _spec(tmp_path: Path, datacenters: bool = True) -> Spec:
    lines = []
    for worker, datacenter in WORKERS.items():
        lines += [f'worker "{worker}" {{', '  address = "http://127.0.0.1:8500"']
        lines += [f'  datacenter = "{datacenter}"'] if datacenters else []
        lines += ["}"]
    for job, (workers, scope) in JOBS.items():
        quoted = ", ".join(f'"{w}"' for w in workers)
        lines += [f'job "{job}" {{', f'  prefix = "jobs/{job}/"', f"  workers = [{quoted}]"]
        lines += [f'  scope = "{scope}"'] if scope and datacenters else []
        lines += ['  schedule = "@every 1h"', '  command = ["/bin/true"]', "}"]
    path = tmp_path / "locks.hcl"
    path.write_text("\n".join(lines) + "\n")
    return load_spec(path)


@pytest.mark.parametrize(
    ("named", "job", "flag", "expected"),
    [
        (True, "both", None, ("dc1", "dc2")),  # every datacenter its workers are in, sorted
        (True, "both", "dc2", ("dc2",)),
        (True, "both", "dc1", ("dc1",)),
        (True, "west", None, ("dc2",)),  # one datacenter: still asked there, not the agent's
        (True, "west", "dc2", ("dc2",)),
        (True, "west", "dc1", "--datacenter dc1: job west has no workers there"),
        (True, "both", "dc9", "--datacenter dc9: no worker of the spec is in it"),
        (False, "both", None, (None,)),  # no datacenters named: the agent's own, as before
        (False, "both", "dc1", "--datacenter dc1: the spec names no datacenters"),
    ],
)
def test_the_datacenters_chosen_for_a_job(
    tmp_path: Path, named: bool, job: str, flag: str | None, expected: tuple[str, ...] | str
) -> None:
    spec = _spec(tmp_path, named)
    [found] = [j for j in spec.jobs if j.name == job]
    if isinstance(expected, str):
        with pytest.raises(InputError, match=expected):
            chosen_datacenters(spec.workers, found, flag)
    else:
        assert chosen_datacenters(spec.workers, found, flag) == expected


@pytest.mark.parametrize(
    "argv",
    [
        ["pause", "both", "--datacenter", "dc9"],
        ["resume", "west", "--datacenter", "dc1"],
        ["trigger", "both", "--datacenter", "dc9"],
        ["status", "--datacenter", "dc9"],
        ["history", "--job", "west", "--datacenter", "dc1"],
        ["check", "--job", "west", "--datacenter", "dc1"],
    ],
)
def test_a_bad_datacenter_flag_is_one_line_and_exit_2_before_consul(
    tmp_path: Path, argv: list[str]
) -> None:
    _spec(tmp_path)
    spec = ["--spec", str(tmp_path / "locks.hcl"), "--address", "127.0.0.1:1"]
    result = CliRunner().invoke(app, [*argv, *spec])
    said = result.output.strip().splitlines()
    if argv[0] == "check":  # Nagios's convention: what keeps it from judging is UNKNOWN, 3
        assert result.exit_code == 3 and said[-1].startswith("UNKNOWN: --datacenter dc1: ")
        return
    assert result.exit_code == EXIT_INPUT, result.output
    assert len(said) == 1 and said[0].startswith("lockctl: error: --datacenter dc"), said


class _Stub:
    """A client that knows which datacenter it is bound to: in_each's only need of it."""

    def __init__(self, datacenter: str | None = None) -> None:
        self.datacenter = datacenter

    def in_datacenter(self, datacenter: str | None) -> _Stub:
        return _Stub(datacenter)


def test_each_datacenter_is_asked_and_a_failure_is_said_for_its_own(
    capsys: pytest.CaptureFixture[str],
) -> None:
    def act(consul: Any) -> list[str]:
        if consul.datacenter == "dc2":
            raise ConsulUnavailable("consul: GET /v1/kv/x: no answer within the client timeout")
        return [f"job j paused in {consul.datacenter}"]

    with pytest.raises(DatacentersFailed) as failed:
        in_each(_Stub(), ("dc1", "dc2", "dc3"), act)  # type: ignore[arg-type]
    out, err = capsys.readouterr()
    # dc3 is still asked after dc2 failed; each line says its datacenter
    assert out.splitlines() == ["dc1: job j paused in dc1", "dc3: job j paused in dc3"]
    assert err.splitlines() == [
        "lockctl: error: dc2: failed: Consul not reached: no answer within the client timeout"
    ]
    assert str(failed.value) == "failed in dc2 (2 of 3 datacenters done)"
    assert failed.value.exit_code == EXIT_PARTIAL  # done in dc1 and dc3: partly done


def test_without_datacenters_the_lines_and_errors_are_as_they_were(
    capsys: pytest.CaptureFixture[str],
) -> None:
    in_each(_Stub(), (None,), lambda consul: ["job j resumed"])  # type: ignore[arg-type]
    assert capsys.readouterr().out == "job j resumed\n"

    def refused(consul: Any) -> list[str]:
        raise ConsulUnavailable("not reached")

    with pytest.raises(ConsulUnavailable):  # the boundary says it, as it always did
        in_each(_Stub(), (None,), refused)  # type: ignore[arg-type]


@responses.activate
def test_a_client_bound_to_a_datacenter_asks_its_kv_with_dc() -> None:
    responses.get("http://127.0.0.1:8500/v1/kv/jobs/a", status=404)
    responses.get("http://127.0.0.1:8500/v1/status/leader", json="127.0.0.1:8300")
    consul = Consul(ConsulSettings(address="http://127.0.0.1:8500"))
    there = consul.in_datacenter("dc2")
    assert consul.in_datacenter(None) is consul
    assert there.kv.get("jobs/a")[0] is None
    there.status.leader()  # the agent's own endpoints are not forwarded
    consul.kv.get("jobs/a")
    sent = [call.request.url for call in responses.calls]
    assert "dc=dc2" in str(sent[0]) and "dc=" not in str(sent[1]) and "dc=" not in str(sent[2])
