"""Login with a JWT (consul/login.py): how a login answer is classified, when to log in again,
the worker config's `consul.login`, and the Login's token hand-over (a fake identity API for
the race a real server cannot be made to produce: a stop while a login is on its way)."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import pytest

from provision.consul import ConsulUnavailable, resolve_settings
from provision.consul.errors import ConsulHTTPError
from provision.consul.identity import LoginToken, token_lifetime
from provision.consul.login import (
    REASON_CHARS,
    Login,
    LoginConfig,
    LoginRefused,
    read_bearer_token,
    refusal_reason,
    relogin_delay,
    retry_delay,
)
from provision.consul.tokens import TokenSource
from provision.errors import EXIT_DENIED, InputError
from provision.runner.environment import RUNNER_ONLY, credential_files
from provision.spec import parse_spec
from provision.system.secrets import Secret
from provision.workers.config import ConfigError, config_record, load_worker_config

RPC = "rpc error making call: rpc error making call: "


@pytest.mark.parametrize(
    ("status", "body", "expected"),
    [
        (403, RPC + "Permission denied", "Permission denied (no binding rule selects"),
        (403, RPC + "ACL not found", "ACL not found (no such auth method?)"),
        (
            500,
            RPC + "error validating claims: square/go-jose/jwt: validation failed, token is "
            "expired (exp)",
            "error validating claims: square/go-jose/jwt: validation failed, token is expired",
        ),
        (
            500,
            RPC + "error validating claims: aud claim does not match any bound audience",
            "error validating claims: aud claim does not match any bound audience",
        ),
        (
            500,
            "rpc error making call: no known key successfully validated the token signature",
            "no known key successfully validated the token signature",
        ),
        (
            500,
            "rpc error making call: error parsing token: square/go-jose: compact JWS format "
            "must have three parts",
            "error parsing token",
        ),
        (400, "Missing auth method name", "Missing auth method name"),
        (500, "No cluster leader", None),  # a fault: Consul unavailable, retried
        (500, "rpc error making call: EOF", None),
        (503, "", None),
    ],
    ids=[
        "403-no-rule",
        "403-no-method",
        "500-expired",
        "500-audience",
        "500-other-key",
        "500-not-a-jwt",
        "400",
        "500-no-leader",
        "500-eof",
        "503-empty",
    ],
)
def test_a_login_answer_is_a_refusal_with_its_reason_or_a_fault(
    status: int, body: str, expected: str | None
) -> None:
    reason = refusal_reason(status, body)
    if expected is None:
        assert reason is None
    else:
        assert reason is not None and reason.startswith(expected)
        assert "rpc error" not in reason


def test_a_refusal_reason_is_one_printable_bounded_line() -> None:
    reason = refusal_reason(500, "error validating claims: \x1b[31mred\nline" + "x" * 500)
    assert reason is not None
    assert "\x1b" not in reason and "\n" not in reason
    assert len(reason) <= REASON_CHARS


@pytest.mark.parametrize(
    ("lifetime", "expected"),
    [(60.0, 40.0), (600.0, 400.0), (86400.0, 57600.0), (None, 300.0), (0.0, 300.0)],
    ids=["1m", "10m", "24h", "no-expiry", "zero"],
)
def test_a_token_is_renewed_when_two_thirds_of_its_life_have_passed(
    lifetime: float | None, expected: float
) -> None:
    assert relogin_delay(lifetime) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("failures", "left", "expected"),
    [
        (1, None, 1.0),
        (2, None, 2.0),
        (3, None, 4.0),
        (9, None, 10.0),
        (4, 6.0, 3.0),
        (1, 0.1, 0.25),
    ],
    ids=["first", "second", "third", "capped", "half-of-what-is-left", "at-least-a-quarter"],
)
def test_a_failed_relogin_is_retried_sooner_as_expiry_nears(
    failures: int, left: float | None, expected: float
) -> None:
    assert retry_delay(failures, left) == pytest.approx(expected)


def test_a_token_lifetime_is_read_on_consuls_clock_nanoseconds_and_all() -> None:
    assert token_lifetime("2026-12-04T22:09:46.7918347Z", "2026-12-04T22:10:46.7918347Z") == 60.0
    assert token_lifetime("2026-12-04T22:09:46Z", "2026-12-04T23:09:46+01:00") == 0.0
    assert token_lifetime(None, "2026-12-04T22:10:46Z") is None
    assert token_lifetime("yesterday", "2026-12-04T22:10:46Z") is None


@pytest.mark.parametrize(
    "content",
    ["", "   \n", "a.b.c\nd.e.f", "a b", "\xff"],
    ids=["empty", "blank", "2l", "sp", "bin"],
)
def test_a_bearer_token_file_that_is_not_one_jwt_is_bad_input(tmp_path: Path, content: str) -> None:
    path = tmp_path / "jwt"
    path.write_bytes(content.encode("latin-1"))
    with pytest.raises(InputError, match=f"{path}: bearer token file is not a JWT"):
        read_bearer_token(path)
    with pytest.raises(InputError, match="cannot read bearer token file"):
        read_bearer_token(tmp_path / "missing")


# --- the worker config -----------------------------------------------------------------------

LOGIN = {"auth_method": "k8s", "bearer_token_file": "/var/run/secrets/tokens/consul"}


def _config(tmp_path: Path, consul: dict[str, Any]) -> Path:
    path = tmp_path / "lockctl.json"
    job = {"lock_key": "locks/r/.lock", "ttl": "15s", "lock_delay": "15s", "schedule": None}
    job |= {"renew_interval": "5s", "kill_grace": "5s", "min_hold": None}
    data = {"format": 1, "worker": "worker-1", "consul": consul, "jobs": {"r": job}}
    path.write_text(json.dumps(data))
    return path


def test_a_config_that_logs_in_names_no_token_file_and_sends_no_token(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CONSUL_HTTP_TOKEN", "a-token-from-the-environment")
    config = load_worker_config(_config(tmp_path, {"address": "http://x:8500", "login": LOGIN}))
    assert config.token_file is None
    assert config.login is not None and config.login.auth_method == "k8s"
    settings = resolve_settings(**config.connection())
    assert settings.token is None  # Consul's token variables are not read for a login
    assert settings.bearer_token_file == Path("/var/run/secrets/tokens/consul")
    assert "/var/run/secrets/tokens/consul" in credential_files(settings)
    assert "LOCKCTL_BEARER_TOKEN_FILE" in RUNNER_ONLY


@pytest.mark.parametrize(
    ("login", "extra", "expected"),
    [
        (LOGIN, {"token_file": "/t"}, "consul.login: give token_file or login, not both"),
        ("k8s", {}, "consul.login: must be an object with auth_method and bearer_token_file"),
        ({**LOGIN, "bearer_token_file": "jwt"}, {}, "consul.login.bearer_token_file: must be an"),
        ({**LOGIN, "auth_method": "a b"}, {}, "consul.login.auth_method: 'a b' is not an auth"),
        ({"auth_method": "k8s"}, {}, "consul.login.bearer_token_file: must be a non-empty"),
        ({**LOGIN, "jwks": "x"}, {}, "consul.login.jwks: unknown field"),
    ],
    ids=["both", "not-an-object", "relative", "bad-name", "no-file", "unknown"],
)
def test_each_login_problem_names_its_field(
    tmp_path: Path, login: Any, extra: dict[str, str], expected: str
) -> None:
    path = _config(tmp_path, {"address": "http://x:8500", "login": login, **extra})
    with pytest.raises(ConfigError) as caught:
        load_worker_config(path)
    assert any(line.startswith(f"{path}: {expected}") for line in caught.value.lines), caught.value


SPEC = """
auth_method "k8s" {
  type = "jwt"
  jwt_validation_pub_keys_file = "issuer.pem"
  max_token_ttl = "10m"
  claim_mappings {
    service_account = "/kubernetes.io/serviceaccount/name"
  }
}
worker "worker-1" {
  identity {
    auth_method = "k8s"
    claims {
      service_account = "worker-1"
    }
  }
}
worker "worker-2" {}
job "r" {
  prefix  = "locks/r/"
  workers = ["worker-1", "worker-2"]
}
"""


def test_worker_config_writes_a_login_for_a_worker_with_an_identity_only(tmp_path: Path) -> None:
    (tmp_path / "issuer.pem").write_text(_PEM)
    spec = parse_spec(SPEC, tmp_path / "locks.hcl")
    bearer = Path("/var/run/secrets/tokens/consul")
    one = config_record(spec, "worker-1", Path("/s/worker-1.token"), bearer_token_file=bearer)
    two = config_record(spec, "worker-2", Path("/s/worker-2.token"), bearer_token_file=bearer)
    assert one["consul"] == {"address": "http://127.0.0.1:8500", "login": {**LOGIN}}
    assert two["consul"] == {"address": "http://127.0.0.1:8500", "token_file": "/s/worker-2.token"}


_PEM = """-----BEGIN PUBLIC KEY-----
MIIBIjANBgkqhkiG9w0BAQEFAAOCAQ8AMIIBCgKCAQEAu1SU1LfVLPHCozMxH2Mo
4lgOEePzNm0tRgeLezV6ffAt0gunVTLw7onLRnrq0/IzW7yWR7QkrmBL7jTKEn5u
+qKhbwKfBstIs+bMY2Zkp18gnTxKLxoS2tFczGkPLPgizskuemMghRniWaoLcyeh
kd3qqGElvW/VDL5AaWTg0nLVkjRo9z+40RQzuVaE8AkAFmxZzow3x+VJYKdjykkJ
0iT9wCS0DRTXu269V264Vf/3jvredZiKRkgwlL9xNAwxXFg0x/XFw005UWVRIkdg
cKWTjpBP2dPwVZ4WWC+9aGVd+Gyn1o0CLelf4rEjGoXbAAEgAqeGUxrcIlbjXfbc
mwIDAQAB
-----END PUBLIC KEY-----
"""


# --- the Login's hand-over ------------------------------------------------------------------


class _FakeIdentity:
    """Answers logins with numbered tokens, or with the error it is given; records logouts."""

    def __init__(self) -> None:
        self.made = 0
        self.logged_out: list[str] = []
        self.fail: Exception | None = None
        self.during_login: Any = None

    def login(self, auth_method: str, bearer_token: Secret) -> LoginToken:
        assert auth_method == "k8s" and bearer_token.reveal() == "a.b.c"
        if self.during_login is not None:
            self.during_login()
        if self.fail is not None:
            raise self.fail
        self.made += 1
        return LoginToken(f"accessor-{self.made}", Secret(f"secret-{self.made}"), 60.0)

    def token_known(self, token: Secret) -> bool:
        return True

    def logout(self, token: Secret) -> None:
        self.logged_out.append(token.reveal())


def _login(tmp_path: Path) -> tuple[Login, _FakeIdentity, TokenSource, list[str]]:
    (tmp_path / "jwt").write_text("a.b.c\n")
    fake, tokens, events = _FakeIdentity(), TokenSource(None, None), []
    login = Login(
        fake,  # type: ignore[arg-type]
        tokens,
        LoginConfig("k8s", tmp_path / "jwt"),
        emit=lambda event, **_fields: events.append(event),
    )
    return login, fake, tokens, events


def test_a_relogin_hands_over_the_token_and_logs_the_old_one_out(tmp_path: Path) -> None:
    login, fake, tokens, events = _login(tmp_path)
    login.login()
    assert tokens.current == Secret("secret-1")
    login.login()
    assert tokens.current == Secret("secret-2") and fake.logged_out == ["secret-1"]
    # a call refused with the old token is sent once more with the new one
    assert tokens.refresh(Secret("secret-1")) == Secret("secret-2")
    login.close()
    assert fake.logged_out == ["secret-1", "secret-2"]
    assert events == ["login", "login", "logout", "logout"]


def test_a_refused_login_is_exit_4_with_consuls_reason_and_a_fault_is_unavailable(
    tmp_path: Path,
) -> None:
    login, fake, tokens, _ = _login(tmp_path)
    body = "rpc error making call: Permission denied"
    fake.fail = ConsulHTTPError.from_status("consul: 403", status=403, body=body)
    with pytest.raises(LoginRefused) as refused:
        login.login()
    assert refused.value.exit_code == EXIT_DENIED
    assert str(refused.value) == (
        "login through auth method 'k8s' refused (403): Permission denied "
        "(no binding rule selects the JWT's claims)"
    )
    fake.fail = ConsulHTTPError.from_status("consul: 500", status=500, body="No cluster leader")
    with pytest.raises(ConsulUnavailable):
        login.login()
    assert tokens.current is None


def test_a_stop_while_a_login_is_on_its_way_logs_that_token_out(tmp_path: Path) -> None:
    login, fake, _tokens, _ = _login(tmp_path)
    login.login()
    closing = threading.Thread(target=login.close)
    fake.during_login = closing.start  # close() runs while the second login is answered
    login.login()
    closing.join()
    assert sorted(fake.logged_out) == ["secret-1", "secret-2"]


# --- verify's rewritten JWT -----------------------------------------------------------------


def test_verify_rewrites_a_jwts_claims_and_keeps_its_signature() -> None:
    import base64

    from provision.verify.login_checks import rewrite_claims

    def part(data: dict[str, Any]) -> str:
        return base64.urlsafe_b64encode(json.dumps(data).encode()).rstrip(b"=").decode()

    claims = {"sub": "a", "kubernetes.io": {"serviceaccount": {"name": "worker-1"}}}
    jwt = f"{part({'alg': 'RS256'})}.{part(claims)}.c2lnbmF0dXJl"
    forged = rewrite_claims(jwt, {"/kubernetes.io/serviceaccount/name": "worker-2", "sub": "b"})
    head, body, signature = forged.reveal().split(".")
    assert head == jwt.split(".")[0] and signature == "c2lnbmF0dXJl"
    decoded = json.loads(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))
    assert decoded == {"sub": "b", "kubernetes.io": {"serviceaccount": {"name": "worker-2"}}}


def test_worker_config_files_name_the_bearer_token_file_not_a_token_file(tmp_path: Path) -> None:
    from provision.system.templates import find_templates_dir
    from provision.workers.files import Placement, write_worker_files

    (tmp_path / "issuer.pem").write_text(_PEM)
    spec = parse_spec(SPEC, tmp_path / "locks.hcl")
    bearer = Path("/run/jwt/consul")
    placement = Placement(None, Path("/etc/lockctl/secrets"), "lockctl", bearer_token_file=bearer)
    out = tmp_path / "out"
    write_worker_files(spec, ["worker-1", "worker-2"], out, find_templates_dir(), placement)
    env_one = (out / "worker-1" / "lockctl.env").read_text()
    assert "LOCKCTL_AUTH_METHOD=k8s\n" in env_one
    assert "LOCKCTL_BEARER_TOKEN_FILE=/run/jwt/consul\n" in env_one
    assert "CONSUL_HTTP_TOKEN_FILE" not in env_one
    assert load_worker_config(out / "worker-1" / "lockctl.json").login is not None
    env_two = (out / "worker-2" / "lockctl.env").read_text()
    assert "CONSUL_HTTP_TOKEN_FILE=/etc/lockctl/secrets/worker-2.token\n" in env_two
    assert "LOCKCTL_BEARER_TOKEN_FILE" not in env_two


def test_verify_bearer_token_flag_is_worker_equals_file(tmp_path: Path) -> None:
    from provision.cli.verify import _bearer_tokens

    (tmp_path / "jwt").write_text("a.b.c\n")
    assert _bearer_tokens([f"worker-1={tmp_path / 'jwt'}"]) == {"worker-1": Secret("a.b.c")}
    with pytest.raises(InputError, match=r"--bearer-token-file 'worker-1': expected WORKER=FILE"):
        _bearer_tokens(["worker-1"])
    with pytest.raises(InputError, match=r"--bearer-token-file w: .*cannot read bearer token"):
        _bearer_tokens([f"w={tmp_path / 'missing'}"])


def test_a_new_token_is_used_once_known_or_when_that_cannot_be_told(tmp_path: Path) -> None:
    login, fake, tokens, _ = _login(tmp_path)
    asked: list[str] = []

    def known(token: Secret) -> bool:
        asked.append(token.reveal())
        if len(asked) == 1:
            return False  # not yet on the server the agent asks: wait
        raise ConsulUnavailable("consul: GET /v1/acl/token/self: connection refused")

    fake.token_known = known  # type: ignore[method-assign]
    login.login()
    assert asked == ["secret-1", "secret-1"] and tokens.current == Secret("secret-1")


@pytest.mark.parametrize(
    ("identity", "jwts", "summary"),
    [
        (False, {}, "not applicable: no worker of the spec logs in"),
        (True, {}, "no JWT to log in with: give --bearer-token-file WORKER=FILE"),
    ],
)
def test_verify_login_checks_say_why_they_are_skipped(
    identity: bool, jwts: dict[str, str], summary: str
) -> None:
    from types import SimpleNamespace

    from provision.verify.evidence import CheckSkipped
    from provision.verify.login_checks import _logins

    worker = SimpleNamespace(name="worker-1", identity=object() if identity else None)
    ctx: Any = SimpleNamespace(
        spec=SimpleNamespace(workers=[worker], auth_methods=[]), bearer_tokens=jwts
    )
    with pytest.raises(CheckSkipped, match=summary.replace("-", r"\-")):
        _logins(ctx)
