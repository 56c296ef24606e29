"""The judgements of verify's tls-http and gossip-encrypted checks: facts in (the probes of
provision/consul/probe.py, an agent's /v1/agent/self), evidence and problems out. Pure, so each
rule has a table test (tests/unit/test_verify_tls_judge.py).

Every string from an agent is made printable here or in the probe, before it reaches a message.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from provision.consul.probe import (
    ANSWERED,
    CLOSED,
    PLAIN_HTTP_REFUSAL,
    TLS_REFUSED,
    UNTRUSTED,
    Outcome,
    TlsProbe,
)
from provision.system.text import printable

SERVE_HTTPS_ONLY = (
    "serve HTTPS only (ports { http = -1, https = 8501 }, ca_file, cert_file, key_file, "
    "verify_incoming = true) and give its https:// address"
)
TURN_ON_GOSSIP = 'set encrypt = "<key from consul keygen>" in every agent\'s config, the same key'

MEMBER_STATUS = {1: "alive", 2: "leaving", 3: "left", 4: "failed"}  # serf's member status codes


@dataclass
class Judgement:
    """What one check concluded about one agent (`where`: "worker-1's agent at https://..."):
    evidence lines, and problems, each what to fix there (none: the promise holds)."""

    where: str
    evidence: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


def summarize(verdicts: Iterable[Judgement]) -> list[str]:
    """The problems of all agents, those with the same remedy said once for all of them:
    "worker-1's agent at ..., worker-2's agent at ...: plain HTTP; serve HTTPS only (...)"."""
    agents_by_problem: dict[str, list[str]] = {}
    for verdict in verdicts:
        for problem in verdict.problems:
            agents_by_problem.setdefault(problem, []).append(verdict.where)
    return [f"{', '.join(agents)}: {problem}" for problem, agents in agents_by_problem.items()]


@dataclass(frozen=True)
class AgentSecurity:
    """What an agent's /v1/agent/self says about its transport security (None: not there)."""

    node: str
    lan_encrypted: str | None  # Stats.serf_lan.encrypted: "true" / "false", a string
    wan_encrypted: str | None  # Stats.serf_wan.encrypted: servers only
    encrypt_verify_incoming: bool | None
    encrypt_verify_outgoing: bool | None
    verify_incoming: bool | None
    http_port: int | None  # DebugConfig.HTTPPort: -1 when plain HTTP is off
    https_port: int | None


def agent_security(self_answer: Mapping[str, Any]) -> AgentSecurity:
    """The fields that matter, from an untrusted /v1/agent/self answer of any shape."""
    stats = _mapping(self_answer.get("Stats"))
    debug = _mapping(self_answer.get("DebugConfig"))
    config = _mapping(self_answer.get("Config"))
    return AgentSecurity(
        node=printable(str(config.get("NodeName", "?")), 80),
        lan_encrypted=_text(_mapping(stats.get("serf_lan")).get("encrypted")),
        wan_encrypted=_text(_mapping(stats.get("serf_wan")).get("encrypted")),
        encrypt_verify_incoming=_flag(debug.get("EncryptVerifyIncoming")),
        encrypt_verify_outgoing=_flag(debug.get("EncryptVerifyOutgoing")),
        verify_incoming=_flag(debug.get("VerifyIncoming")),
        http_port=_port(debug.get("HTTPPort")),
        https_port=_port(debug.get("HTTPSPort")),
    )


def judge_tls(label: str, probe: TlsProbe, config: AgentSecurity | None) -> Judgement:
    """tls-http for one agent: plain HTTP refused, its certificate verified against the CA, a
    client without a certificate refused. `label`: "worker-1's agent" and the like."""
    where = f"{label} at {probe.address}"
    verdict = Judgement(where)
    verdict.evidence.append(f"{where}: plain HTTP -> {_said(probe.plain_http)}")
    if config is not None:
        verdict.evidence.append(
            f"{where}: DebugConfig.HTTPPort={config.http_port} HTTPSPort={config.https_port} "
            f"VerifyIncoming={config.verify_incoming}"
        )
    if not probe.https:
        verdict.problems.append(_plain_address_problem(probe.plain_http))
        return verdict
    if _serves_plain_http(probe.plain_http):
        verdict.problems.append(f"its port answers plain HTTP; {SERVE_HTTPS_ONLY}")
    if config is not None and config.http_port is not None and config.http_port > 0:
        verdict.problems.append(
            f"also serves plain HTTP on port {config.http_port}; set ports {{ http = -1 }}"
        )
    _judge_certificate(where, probe, verdict)
    _judge_client_refused(where, probe, verdict)
    return verdict


def _plain_address_problem(plain: Outcome) -> str:
    if plain.kind == ANSWERED and plain.status == 400 and PLAIN_HTTP_REFUSAL in plain.detail:
        return "this address speaks HTTPS: give its https:// address"
    return f"plain HTTP; {SERVE_HTTPS_ONLY}"


def _serves_plain_http(plain: Outcome) -> bool:
    if plain.kind != ANSWERED:
        return False  # refused, closed, reset: no plain HTTP here
    return not (plain.status == 400 and PLAIN_HTTP_REFUSAL in plain.detail)


def _judge_certificate(where: str, probe: TlsProbe, verdict: Judgement) -> None:
    verified = probe.verified
    if verified is None:
        return
    if verified.handshake_done:
        pair = " with lockctl's client certificate" if probe.client_pair else ""
        verdict.evidence.append(
            f"{where}: certificate {probe.peer} verified against {probe.ca} (chain and host "
            f"name); a request{pair} -> {_said(verified)}"
        )
        if probe.client_pair and verified.kind != ANSWERED:
            verdict.problems.append(
                f"refused lockctl's client certificate ({_said(verified)}); give a "
                "pair signed by the CA the agents trust (--client-cert, --client-key)"
            )
        return
    verdict.evidence.append(f"{where}: TLS checking its certificate -> {_said(verified)}")
    if verified.kind == UNTRUSTED:
        verdict.problems.append(
            f"its certificate does not verify against {probe.ca} ({verified.detail}); "
            "give the CA that signed it (--ca-cert or CONSUL_CACERT), and a certificate with "
            "the agent's address among its names"
        )
    else:
        verdict.problems.append(f"no TLS handshake ({_said(verified)})")


def _judge_client_refused(where: str, probe: TlsProbe, verdict: Judgement) -> None:
    without = probe.without_cert
    if without is None:
        return
    verdict.evidence.append(f"{where}: TLS without a client certificate -> {_said(without)}")
    if without.kind == ANSWERED:
        verdict.problems.append(
            f"a client without a certificate got an answer ({without.status}); set "
            "verify_incoming = true (and ca_file: the CA clients' certificates are checked "
            "against)"
        )
    elif without.kind not in (TLS_REFUSED, CLOSED):
        verdict.problems.append(
            f"cannot tell whether a client without a certificate is refused ({_said(without)})"
        )


def judge_gossip(label: str, address: str, config: AgentSecurity) -> Judgement:
    """gossip-encrypted for one agent, from its /v1/agent/self."""
    where = f"{label} ({config.node}) at {address}"
    verdict = Judgement(where)
    wan = "" if config.wan_encrypted is None else f" serf_wan.encrypted={config.wan_encrypted}"
    verdict.evidence.append(
        f"{where}: serf_lan.encrypted={config.lan_encrypted}{wan} "
        f"EncryptVerifyIncoming={config.encrypt_verify_incoming} "
        f"EncryptVerifyOutgoing={config.encrypt_verify_outgoing}"
    )
    pools = [("LAN", config.lan_encrypted), ("WAN", config.wan_encrypted)]
    if config.lan_encrypted is None:
        verdict.problems.append("cannot tell: /v1/agent/self has no Stats.serf_lan.encrypted")
    known = [pool for pool, value in pools if value is not None]
    off = [pool for pool, value in pools if value is not None and value != "true"]
    if off:  # the pools are named only when some are encrypted: one remedy reads as one
        which = "" if off == known else f"{' and '.join(off)} "
        verdict.problems.append(f"{which}gossip not encrypted; {TURN_ON_GOSSIP}")
    elif config.lan_encrypted == "true":
        for name, value in (
            ("encrypt_verify_incoming", config.encrypt_verify_incoming),
            ("encrypt_verify_outgoing", config.encrypt_verify_outgoing),
        ):
            if value is False:
                verdict.problems.append(
                    f"{name} = false: it still {_leak(name)} unencrypted gossip; set "
                    f"{name} = true once every agent has the key"
                )
    return verdict


def unasked_members(members: Iterable[Mapping[str, Any]], asked: set[str]) -> list[str]:
    """The LAN members no one asked directly, with their role and status, e.g. "server-2
    (server, alive)": gossip-encrypted can say of them only what docs/verify.md explains."""
    described = []
    for member in members:
        name = printable(str(member.get("Name", "?")), 80)
        if name in asked:
            continue
        role = printable(str(_mapping(member.get("Tags")).get("role", "?")), 20)
        status = MEMBER_STATUS.get(_port(member.get("Status")) or 0, "?")
        described.append(f"{name} ({'server' if role == 'consul' else role}, {status})")
    return sorted(described)


def _leak(name: str) -> str:
    return "accepts" if name.endswith("incoming") else "sends"


def _said(outcome: Outcome) -> str:
    """What a probe got, in a few words."""
    if outcome.kind == ANSWERED:
        return f"{outcome.status} {outcome.detail}".strip()
    if outcome.kind == TLS_REFUSED:
        return f"refused by TLS: {outcome.detail}"
    if outcome.kind == CLOSED:
        return f"closed without an answer: {outcome.detail}"
    return f"{outcome.kind}: {outcome.detail}"


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _text(value: Any) -> str | None:
    return None if value is None else printable(str(value), 20)


def _flag(value: Any) -> bool | None:
    return value if isinstance(value, bool) else None


def _port(value: Any) -> int | None:  # a port, a status code: a JSON integer, not a bool
    return value if isinstance(value, int) and not isinstance(value, bool) else None
