"""The sessions an in-process lockctl command makes, noted as Consul answers each create, so
that a test asks Consul about those sessions by ID afterwards, never about every session of a
node (other tests' sessions live there too, some until their TTL runs out)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import pytest

from provision.consul import Consul
from provision.consul.api import SessionAPI


def note_sessions(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The list the IDs of every session this process creates from now on are appended to
    (from any thread), until the test ends."""
    made: list[str] = []
    create = SessionAPI.create

    def noting(self: SessionAPI, *args: Any, **kwargs: Any) -> str:
        session_id = create(self, *args, **kwargs)
        made.append(session_id)
        return session_id

    monkeypatch.setattr(SessionAPI, "create", noting)
    return made


def still_there(consul: Consul, session_ids: Iterable[str]) -> list[str]:
    """Which of `session_ids` Consul still knows (read by ID, from the leader)."""
    return [i for i in session_ids if consul.session.info(i, consistency="consistent")]
