"""The transport-security checks of `lockctl verify`: tls-http (plain HTTP refused, certificates
verified both ways) and gossip-encrypted, on every agent verify talks to. The facts come from
provision/consul/ (the probes, /v1/agent/self), the verdicts from tls_judge.py."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from provision.consul.errors import ConsulError
from provision.consul.probe import TlsProbe, probe_tls
from provision.system.text import printable
from provision.verify.context import VerifyContext
from provision.verify.evidence import CheckFailed, CheckSkipped, Evidence
from provision.verify.tls_judge import (
    AgentSecurity,
    Judgement,
    agent_security,
    judge_gossip,
    judge_tls,
    summarize,
    unasked_members,
)

ERROR_LIMIT = 300


@dataclass(frozen=True)
class Agent:
    label: str  # "worker-1's agent", "the management agent"
    address: str


def agents_of(ctx: VerifyContext) -> list[Agent]:
    """Every agent verify talks to: each worker's, and the management address (when a
    management token is given: only then does verify use it), each address once."""
    agents = [Agent(f"{w.name}'s agent", w.address) for w in ctx.workers.values()]
    known = {agent.address for agent in agents}
    if ctx.management is not None and ctx.settings.address not in known:
        agents.append(Agent("the management agent", ctx.settings.address))
    return agents


def check_tls_http(ctx: VerifyContext, ev: Evidence) -> str:
    agents = agents_of(ctx)
    with ThreadPoolExecutor(max_workers=max(1, len(agents))) as pool:
        probes = list(pool.map(lambda a: probe_tls(ctx.settings, a.address), agents))
    configs = _read_all(ctx, agents, ev)
    problems = _collect(
        ev, [judge_tls(a.label, p, c) for a, p, c in zip(agents, probes, configs, strict=True)]
    )
    if problems:
        raise CheckFailed("; ".join(problems))
    return (
        f"{len(agents)} agents refuse plain HTTP; their certificates verify against "
        f"{_ca_of(probes)}; a client without a certificate is refused"
    )


def check_gossip_encrypted(ctx: VerifyContext, ev: Evidence) -> str:
    management = ctx.management
    if management is None:
        raise CheckSkipped("needs a management token (agent read) to read each agent's gossip")
    agents = agents_of(ctx)
    configs = _read_all(ctx, agents, ev)
    verdicts, asked = [], set()
    for agent, config in zip(agents, configs, strict=True):
        if config is None:
            where = f"{agent.label} at {agent.address}"
            verdicts.append(Judgement(where, problems=["/v1/agent/self unread (see evidence)"]))
            continue
        asked.add(config.node)
        verdicts.append(judge_gossip(agent.label, agent.address, config))
    problems = _collect(ev, verdicts)
    others = _members_not_asked(ctx, asked, ev, infer=not problems)
    if problems:
        raise CheckFailed("; ".join(problems))
    rest = f"; {len(others)} other members not asked (see evidence)" if others else ""
    return f"gossip encrypted (LAN, and WAN on servers) on the {len(asked)} agents asked{rest}"


def _read_all(ctx: VerifyContext, agents: list[Agent], ev: Evidence) -> list[AgentSecurity | None]:
    """What each agent's /v1/agent/self says (None: no management token, or an error, which
    goes into the evidence), asked of all at once."""
    management = ctx.management
    if management is None:
        return [None for _ in agents]

    def read(agent: Agent) -> AgentSecurity | str:
        try:
            return agent_security(management.with_settings(address=agent.address).agent.self())
        except ConsulError as exc:
            why = printable(str(exc), ERROR_LIMIT)
            return f"{agent.label} at {agent.address}: /v1/agent/self: {why}"

    with ThreadPoolExecutor(max_workers=max(1, len(agents))) as pool:
        answers = list(pool.map(read, agents))
    for answer in answers:
        if isinstance(answer, str):
            ev.add(answer)
    return [answer if isinstance(answer, AgentSecurity) else None for answer in answers]


def _members_not_asked(
    ctx: VerifyContext, asked: set[str], ev: Evidence, *, infer: bool
) -> list[str]:
    """The members of the LAN pool no one asked (servers, mostly), as the management agent
    sees them: named in the evidence, and, when every agent asked encrypts and refuses
    unencrypted gossip (`infer`), what that says of them (docs/verify.md)."""
    management = ctx.management
    if management is None:
        return []
    try:
        others = unasked_members(management.agent.members(), asked)
    except ConsulError as exc:
        ev.add(f"members: not read ({printable(str(exc), ERROR_LIMIT)})")
        return []
    if others:
        inferred = (
            "; the agents asked refuse unencrypted gossip, so a member they see alive speaks "
            "gossip with the key"
            if infer
            else ""
        )
        ev.add(f"not asked (verify has no HTTP address for them): {', '.join(others)}{inferred}")
    return others


def _collect(ev: Evidence, verdicts: list[Judgement]) -> list[str]:
    """Every verdict's evidence into `ev`; their problems, one per remedy."""
    for verdict in verdicts:
        for line in verdict.evidence:
            ev.add(line)
    return summarize(verdicts)


def _ca_of(probes: list[TlsProbe]) -> str:
    return next((probe.ca for probe in probes), "the CA")
