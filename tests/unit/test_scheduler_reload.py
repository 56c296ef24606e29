"""The scheduler's pure decisions about Consul's answers and reloads (no Consul, no process)."""

from __future__ import annotations

import pytest

from provision.consul import (
    ConsulError,
    ConsulHTTPError,
    ConsulNotReached,
    ConsulUnavailable,
)
from provision.scheduler.loop import token_refused


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
    why = token_refused(error)
    assert (why is not None) == refused
    if why is not None:
        assert why.startswith("Consul refused the token: ") and "403" in why
