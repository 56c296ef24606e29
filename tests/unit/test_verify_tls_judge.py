"""The judgements of tls-http and gossip-encrypted as tables: facts (what the probes got, what
/v1/agent/self said, in the shapes measured on 1.8.7: docs/notes/consul-facts.md) in, problems
out."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from provision.consul.probe import (
    ANSWERED,
    CLOSED,
    ERROR,
    PLAIN_HTTP_REFUSAL,
    TIMEOUT,
    TLS_REFUSED,
    UNREACHABLE,
    UNTRUSTED,
    Outcome,
    TlsProbe,
)
from provision.verify.tls_judge import (
    AgentSecurity,
    agent_security,
    judge_gossip,
    judge_tls,
    summarize,
    unasked_members,
)

HTTPS = "https://127.0.72.21:8501"
HTTP = "http://127.0.71.21:8500"
REFUSED_400 = Outcome(ANSWERED, 400, PLAIN_HTTP_REFUSAL)
LEADER = Outcome(ANSWERED, 200, '"127.0.72.11:8300"', handshake_done=True)
ALERT = Outcome(TLS_REFUSED, detail="SSLV3_ALERT_BAD_CERTIFICATE (SSLError)", handshake_done=True)
GOOD = TlsProbe(
    HTTPS, REFUSED_400, LEADER, ALERT, "/s/tls/ca.pem", True, "server.dc1.consul [...] issued by CA"
)
TLS_CONFIG = AgentSecurity("worker-1", "true", None, True, True, True, -1, 8501)
PLAIN_CONFIG = AgentSecurity("worker-1", "false", None, True, True, False, 8500, -1)


TLS_CASES: list[tuple[str, TlsProbe, AgentSecurity | None, list[str]]] = [
    ("HTTPS only, both ways", GOOD, TLS_CONFIG, []),
    ("without a management token: the probes alone", GOOD, None, []),
    (
        "the reset variant of the refusal (the alert lost the race)",
        replace(GOOD, without_cert=Outcome(CLOSED, detail="reset", handshake_done=True)),
        TLS_CONFIG,
        [],
    ),
    (
        "TLS 1.2: refused in the handshake",
        replace(GOOD, without_cert=Outcome(TLS_REFUSED, detail="alert")),
        TLS_CONFIG,
        [],
    ),
    (
        "plain HTTP address",
        TlsProbe(HTTP, Outcome(ANSWERED, 200, '"x"'), None, None, "the system CAs", False, ""),
        PLAIN_CONFIG,
        [
            "plain HTTP; serve HTTPS only (ports { http = -1, https = 8501 }, ca_file, "
            "cert_file, key_file, verify_incoming = true) and give its https:// address"
        ],
    ),
    (
        "http:// address of an HTTPS port",
        TlsProbe("http://h:8501", REFUSED_400, None, None, "ca", True, ""),
        None,
        ["this address speaks HTTPS: give its https:// address"],
    ),
    (
        "https address, but its port also answers plain HTTP",
        replace(GOOD, plain_http=Outcome(ANSWERED, 200, '"x"')),
        TLS_CONFIG,
        ["its port answers plain HTTP; serve HTTPS only"],
    ),
    (
        "HTTP port still open beside HTTPS",
        GOOD,
        replace(TLS_CONFIG, http_port=8500),
        ["also serves plain HTTP on port 8500; set ports { http = -1 }"],
    ),
    (
        "certificate from another CA",
        replace(
            GOOD,
            verified=Outcome(UNTRUSTED, detail="unable to get local issuer certificate"),
        ),
        TLS_CONFIG,
        [
            "its certificate does not verify against /s/tls/ca.pem (unable to get local issuer "
            "certificate); give the CA that signed it"
        ],
    ),
    (
        "no handshake at all",
        replace(GOOD, verified=Outcome(TLS_REFUSED, detail="WRONG_VERSION_NUMBER")),
        TLS_CONFIG,
        ["no TLS handshake (refused by TLS: WRONG_VERSION_NUMBER)"],
    ),
    (
        "lockctl's pair refused",
        replace(GOOD, verified=ALERT),
        TLS_CONFIG,
        ["refused lockctl's client certificate"],
    ),
    (
        "without verify_incoming: a client without a certificate is answered",
        replace(GOOD, without_cert=LEADER),
        replace(TLS_CONFIG, verify_incoming=False),
        ["a client without a certificate got an answer (200); set verify_incoming = true"],
    ),
    (
        "the refusal probe timed out",
        replace(GOOD, without_cert=Outcome(TIMEOUT, detail="no answer")),
        TLS_CONFIG,
        ["cannot tell whether a client without a certificate is refused"],
    ),
    (
        "the CA file could not be read",
        replace(GOOD, verified=Outcome(ERROR, detail="cannot load the TLS files")),
        TLS_CONFIG,
        ["no TLS handshake (error: cannot load the TLS files)"],
    ),
    (
        "the agent went away",
        replace(GOOD, without_cert=Outcome(UNREACHABLE, detail="Connection refused")),
        TLS_CONFIG,
        ["cannot tell whether a client without a certificate is refused (unreachable: "],
    ),
]


@pytest.mark.parametrize(
    ("probe", "config", "expected"),
    [case[1:] for case in TLS_CASES],
    ids=[case[0] for case in TLS_CASES],
)
def test_tls_http(probe: TlsProbe, config: AgentSecurity | None, expected: list[str]) -> None:
    verdict = judge_tls("worker-1's agent", probe, config)
    assert verdict.where == f"worker-1's agent at {probe.address}"
    assert len(verdict.problems) == len(expected), verdict.problems
    for problem, wanted in zip(verdict.problems, expected, strict=True):
        assert wanted in problem


def test_tls_evidence_says_what_each_probe_got() -> None:
    evidence = judge_tls("worker-1's agent", GOOD, TLS_CONFIG).evidence
    assert evidence == [
        f"worker-1's agent at {HTTPS}: plain HTTP -> 400 {PLAIN_HTTP_REFUSAL}",
        f"worker-1's agent at {HTTPS}: DebugConfig.HTTPPort=-1 HTTPSPort=8501 VerifyIncoming=True",
        f"worker-1's agent at {HTTPS}: certificate server.dc1.consul [...] issued by CA verified "
        "against /s/tls/ca.pem (chain and host name); a request with lockctl's client "
        'certificate -> 200 "127.0.72.11:8300"',
        f"worker-1's agent at {HTTPS}: TLS without a client certificate -> refused by TLS: "
        "SSLV3_ALERT_BAD_CERTIFICATE (SSLError)",
    ]


GOSSIP_CASES: list[tuple[str, AgentSecurity, list[str]]] = [
    ("client agent, encrypted", TLS_CONFIG, []),
    ("server, LAN and WAN encrypted", replace(TLS_CONFIG, wan_encrypted="true"), []),
    (
        "plain cluster",
        PLAIN_CONFIG,
        [
            'gossip not encrypted; set encrypt = "<key from consul keygen>" in every agent\'s '
            "config, the same key"
        ],
    ),
    (
        "server, plain: LAN and WAN off, said as one",
        replace(PLAIN_CONFIG, wan_encrypted="false"),
        ["gossip not encrypted; set encrypt"],
    ),
    (
        "server with WAN unencrypted",
        replace(TLS_CONFIG, wan_encrypted="false"),
        ["WAN gossip not encrypted"],
    ),
    (
        "migrating: accepts unencrypted gossip",
        replace(TLS_CONFIG, encrypt_verify_incoming=False),
        ["encrypt_verify_incoming = false: it still accepts unencrypted gossip"],
    ),
    (
        "migrating: sends unencrypted gossip",
        replace(TLS_CONFIG, encrypt_verify_outgoing=False),
        ["encrypt_verify_outgoing = false: it still sends unencrypted gossip"],
    ),
    (
        "no such field (another version)",
        replace(TLS_CONFIG, lan_encrypted=None),
        ["cannot tell: /v1/agent/self has no Stats.serf_lan.encrypted"],
    ),
]


@pytest.mark.parametrize(
    ("config", "expected"), [c[1:] for c in GOSSIP_CASES], ids=[c[0] for c in GOSSIP_CASES]
)
def test_gossip_encrypted(config: AgentSecurity, expected: list[str]) -> None:
    verdict = judge_gossip("worker-1's agent", HTTPS, config)
    assert len(verdict.problems) == len(expected), verdict.problems
    assert verdict.where == f"worker-1's agent (worker-1) at {HTTPS}"
    for problem, wanted in zip(verdict.problems, expected, strict=True):
        assert problem.startswith(wanted)
    assert verdict.evidence[0].startswith(
        f"worker-1's agent (worker-1) at {HTTPS}: serf_lan.encrypted={config.lan_encrypted}"
    )


# /v1/agent/self as measured on 1.8.7 (abridged): a server of the TLS cluster, and hostile.
SERVER_SELF: dict[str, Any] = {
    "Config": {"NodeName": "server-1", "Server": True, "Version": "1.8.7"},
    "DebugConfig": {
        "EncryptKey": "hidden",
        "EncryptVerifyIncoming": True,
        "EncryptVerifyOutgoing": True,
        "VerifyIncoming": True,
        "HTTPPort": -1,
        "HTTPSPort": 8501,
    },
    "Stats": {"serf_lan": {"encrypted": "true"}, "serf_wan": {"encrypted": "true"}},
}


def test_agent_security_reads_the_measured_fields() -> None:
    assert agent_security(SERVER_SELF) == AgentSecurity(
        "server-1", "true", "true", True, True, True, -1, 8501
    )


@pytest.mark.parametrize(
    "answer",
    [
        {},
        {"Stats": "no", "DebugConfig": [], "Config": None},
        {"Stats": {"serf_lan": {"encrypted": "\x1b[2Jtrue"}}, "Config": {"NodeName": "\u202ex"}},
        {"DebugConfig": {"HTTPPort": True, "VerifyIncoming": "yes", "HTTPSPort": "8501"}},
    ],
)
def test_agent_security_of_any_shape_is_printable(answer: dict[str, Any]) -> None:
    security = agent_security(answer)
    assert security.lan_encrypted != "true"  # an escaped "true" is not true
    assert security.http_port is None and security.verify_incoming in (None,)
    for text in (security.node, security.lan_encrypted or ""):
        assert text.isprintable()


def test_members_not_asked() -> None:
    members = [
        {"Name": "server-1", "Status": 1, "Tags": {"role": "consul"}},
        {"Name": "server-2", "Status": 1, "Tags": {"role": "consul"}},
        {"Name": "server-3", "Status": 4, "Tags": {"role": "consul"}},
        {"Name": "worker-1", "Status": 1, "Tags": {"role": "node"}},
        {"Name": "\x1b[31mx", "Status": "odd", "Tags": None},
    ]
    assert unasked_members(members, {"server-1", "worker-1"}) == [
        "\\x1b[31mx (?, ?)",
        "server-2 (server, alive)",
        "server-3 (server, failed)",
    ]


def test_one_remedy_is_said_once_for_every_agent_that_needs_it() -> None:
    plain = TlsProbe(HTTP, Outcome(ANSWERED, 200, '"x"'), None, None, "ca", False, "")
    verdicts = [
        judge_tls("worker-1's agent", plain, None),
        judge_tls("worker-2's agent", replace(plain, address="http://w2:8500"), None),
        judge_tls("the management agent", replace(GOOD, without_cert=LEADER), None),
    ]
    assert summarize(verdicts) == [
        f"worker-1's agent at {HTTP}, worker-2's agent at http://w2:8500: plain HTTP; serve "
        "HTTPS only (ports { http = -1, https = 8501 }, ca_file, cert_file, key_file, "
        "verify_incoming = true) and give its https:// address",
        f"the management agent at {HTTPS}: a client without a certificate got an answer (200); "
        "set verify_incoming = true (and ca_file: the CA clients' certificates are checked "
        "against)",
    ]
    assert summarize([judge_tls("worker-1's agent", GOOD, TLS_CONFIG)]) == []
