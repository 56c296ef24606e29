"""The scheduler's pure decisions about Consul's answers and reloads (no Consul, no process)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from provision.consul import (
    ConsulError,
    ConsulHTTPError,
    ConsulNotReached,
    ConsulUnavailable,
    GivenSettings,
    PermissionDenied,
    check_tls_files,
    resolve_settings,
)
from provision.errors import InputError
from provision.scheduler.reload import plan_reload
from provision.timings import JobTimings
from provision.workers.config import JobConfig


def _http(status: int, body: str) -> ConsulHTTPError:
    where = "consul: PUT /v1/session/create on https://127.0.0.21:8501"
    return ConsulHTTPError.from_status(f"{where}: {status} {body}", status=status, body=body)


@pytest.mark.parametrize(
    ("error", "refused"),
    [
        (_http(403, "ACL not found"), True),
        (_http(403, "Permission denied"), True),
        (_http(500, "No cluster leader"), False),
        (_http(404, "Session id not found"), False),
        (ConsulNotReached("consul: cannot connect (ConnectionError)"), False),
        (ConsulUnavailable("consul: no answer within the client timeout"), False),
        (ConsulError("consul: something else"), False),
    ],
)
def test_only_a_403_is_a_refused_token_and_not_consul_unavailable(
    error: ConsulError, refused: bool
) -> None:
    # the tick core says a PermissionDenied as `refused` (tick-failed), anything else as
    # `unavailable` (tick/core.py _failed): the class decides, never the text
    assert isinstance(error, PermissionDenied) == refused
    if refused:
        assert "403" in str(error)


# --- the TLS files a scheduler checks before it starts or reloads ------------------------------
@pytest.fixture(scope="module")
def pem(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A self-signed certificate and its key (openssl), and another key that is not its."""
    folder = tmp_path_factory.mktemp("pem")
    for name in ("good", "other"):
        subprocess.run(
            ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256",
             "-nodes", "-subj", f"/CN={name}", "-days", "1",
             "-keyout", str(folder / f"{name}.key"), "-out", str(folder / f"{name}.pem")],
            check=True, capture_output=True,
        )  # fmt: skip
    (folder / "empty.pem").write_text("")
    (folder / "junk.pem").write_text("-----BEGIN CERTIFICATE-----\nnot base64\n")
    return {p.name: p for p in folder.iterdir()} | {"folder": folder}


LABELS = (("ca_cert", "cfg: consul.ca_file"), ("client_cert", "cfg: consul.cert_file"))


@pytest.mark.parametrize(
    ("ca", "cert", "key", "problem"),
    [
        ("good.pem", "good.pem", "good.key", None),
        ("good.pem", None, None, None),
        ("empty.pem", None, None, ("consul.ca_file", "empty.pem", "not a PEM file")),
        ("junk.pem", None, None, ("consul.ca_file", "junk.pem", "not a CA certificate")),
        ("folder", None, None, ("consul.ca_file", "folder", "cannot read: a folder")),
        ("good.pem", "good.pem", "other.key", ("consul.cert_file", "good.pem", "not a certif")),
        ("good.pem", "junk.pem", "good.key", ("consul.cert_file", "junk.pem", "not a certif")),
    ],
)
def test_check_tls_files_refuses_what_tls_could_not_use_naming_where_it_came_from(
    pem: dict[str, Path],
    ca: str,
    cert: str | None,
    key: str | None,
    problem: tuple[str, str, str] | None,
) -> None:
    given = GivenSettings(
        address="https://127.0.0.1:8501",
        ca_cert=pem[ca],
        client_cert=pem[cert] if cert else None,
        client_key=pem[key] if key else None,
        given_by=LABELS,
    )
    settings = resolve_settings(given, env={})
    if problem is None:
        check_tls_files(settings)
        return
    with pytest.raises(InputError) as refused:
        check_tls_files(settings)
    key_name, file, why = problem
    assert str(refused.value).startswith(f"cfg: {key_name} {pem[file]}: {why}"), refused.value


# --- which loops a reload changes -------------------------------------------------------------
def _job(name: str, schedule: str = "@every 5s") -> JobConfig:
    return JobConfig(
        name,
        f"locks/{name}/.lock",
        JobTimings(15.0, 15.0, 5.0, 5.0, 0.0),
        schedule,
        command=("true",),
    )


A, B, C = _job("a"), _job("b"), _job("c")


@pytest.mark.parametrize(
    ("running", "fresh", "moved", "plan"),
    [
        ([A, B], [A, B], False, ((["a", "b"]), [], [], [])),
        ([A, B], [A, B, C], False, (["a", "b"], ["c"], [], [])),
        ([A, B], [A], False, (["a"], [], ["b"], [])),
        ([A, B], [A, _job("b", "@every 7s")], False, (["a"], [], [], ["b"])),
        ([A, B], [A, B], True, ([], [], [], ["a", "b"])),  # a new connection: every loop
        ([A, B], [C], True, ([], ["c"], ["a", "b"], [])),
        ([A], [_job("a", "@every 7s"), B], False, ([], ["b"], [], ["a"])),
    ],
)
def test_a_reload_changes_only_the_loops_whose_job_or_connection_changed(
    running: list[JobConfig],
    fresh: list[JobConfig],
    moved: bool,
    plan: tuple[list[str], list[str], list[str], list[str]],
) -> None:
    planned = plan_reload({j.name: j for j in running}, {j.name: j for j in fresh}, moved)
    assert (planned.keep, planned.add, planned.remove, planned.replace) == tuple(
        tuple(names) for names in plan
    )
