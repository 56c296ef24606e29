"""Settings: flag > Consul's own environment variables > defaults, and bad values -> InputError."""

from __future__ import annotations

import math
import stat
from pathlib import Path

import pytest

from provision.consul.settings import (
    DEFAULT_ADDRESS,
    DEFAULT_TIMEOUT,
    ConsulSettings,
    GivenSettings,
    normalize_address,
    resolve_settings,
)
from provision.errors import EXIT_INPUT, InputError
from provision.system.secrets import MASK, Secret, read_secret_file, write_secret_file

TOKEN = "7c5a0f1e-0000-4000-8000-00000000beef"


@pytest.fixture
def pem_files(tmp_path: Path) -> dict[str, Path]:
    """Three distinct files standing in for a CA bundle, a client cert and its key."""
    files = {}
    for name in ("ca", "cert", "key", "ca-flag", "cert-flag", "key-flag"):
        files[name] = tmp_path / f"{name}.pem"
        files[name].write_text(f"{name}\n")
    return files


def write_token(path: Path, value: str) -> Path:
    path.write_text(f"  {value}\n")
    return path


# --- defaults -------------------------------------------------------------------------------


def test_defaults_with_an_empty_environment() -> None:
    settings = resolve_settings(env={})
    assert settings == ConsulSettings()
    assert settings.address == DEFAULT_ADDRESS == "http://127.0.0.1:8500"
    assert settings.token is None
    assert settings.ca_cert is None
    assert settings.client_cert is None
    assert settings.client_key is None
    assert settings.verify_tls is True
    assert settings.timeout == DEFAULT_TIMEOUT > 0


def test_the_process_environment_is_read_when_no_env_is_given(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("CONSUL_HTTP_ADDR", "10.1.2.3:8500")
    monkeypatch.delenv("CONSUL_HTTP_TOKEN", raising=False)
    monkeypatch.delenv("CONSUL_HTTP_TOKEN_FILE", raising=False)
    assert resolve_settings().address == "http://10.1.2.3:8500"


def test_empty_environment_values_count_as_unset() -> None:
    env = {
        "CONSUL_HTTP_ADDR": "",
        "CONSUL_HTTP_TOKEN": "",
        "CONSUL_HTTP_TOKEN_FILE": "",
        "CONSUL_CACERT": "",
        "CONSUL_HTTP_SSL_VERIFY": "",
    }
    assert resolve_settings(env=env) == ConsulSettings()


# --- address --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ("127.0.0.21:8500", "http://127.0.0.21:8500"),
        ("http://127.0.0.21:8500", "http://127.0.0.21:8500"),
        ("http://127.0.0.21:8500/", "http://127.0.0.21:8500"),
        ("http://consul.internal", "http://consul.internal:8500"),
        ("https://consul.internal:8501", "https://consul.internal:8501"),
        ("https://consul.internal", "https://consul.internal:443"),
        ("HTTPS://consul.internal:8501", "https://consul.internal:8501"),
        ("  http://[::1]:8500  ", "http://[::1]:8500"),
    ],
)
def test_address_is_normalised_to_a_base_url(given: str, expected: str) -> None:
    assert normalize_address(given) == expected
    assert resolve_settings(env={"CONSUL_HTTP_ADDR": given}).address == expected


def test_https_address_from_the_environment_is_kept() -> None:
    settings = resolve_settings(env={"CONSUL_HTTP_ADDR": "https://10.0.0.5:8501"})
    assert settings.address == "https://10.0.0.5:8501"


def test_consul_http_ssl_turns_a_bare_address_into_https() -> None:
    env = {"CONSUL_HTTP_ADDR": "10.0.0.5:8501", "CONSUL_HTTP_SSL": "true"}
    assert resolve_settings(env=env).address == "https://10.0.0.5:8501"
    env["CONSUL_HTTP_SSL"] = "false"
    assert resolve_settings(env=env).address == "http://10.0.0.5:8501"


def test_address_flag_beats_the_environment() -> None:
    env = {"CONSUL_HTTP_ADDR": "http://10.0.0.1:8500"}
    settings = resolve_settings(GivenSettings(address="https://10.0.0.2:8501"), env=env)
    assert settings.address == "https://10.0.0.2:8501"


@pytest.mark.parametrize(
    "bad",
    [
        "ftp://10.0.0.1:8500",
        "unix:///var/run/consul.sock",
        "http://",
        "http://:8500",
        "http://10.0.0.1:notaport",
        "http://10.0.0.1:99999",
        "http://10.0.0.1:8500/v1/kv",
        "http://10.0.0.1:8500?token=x",
        "http://10.0.0.1:8500#frag",
        "   ",
    ],
)
def test_bad_address_is_an_input_error(bad: str) -> None:
    with pytest.raises(InputError) as caught:
        resolve_settings(env={"CONSUL_HTTP_ADDR": bad})
    assert caught.value.exit_code == EXIT_INPUT
    assert "Consul address" in str(caught.value)
    with pytest.raises(InputError):
        resolve_settings(GivenSettings(address=bad), env={})


# --- token ----------------------------------------------------------------------------------


def test_token_from_consul_http_token() -> None:
    settings = resolve_settings(env={"CONSUL_HTTP_TOKEN": f" {TOKEN}\n"})
    assert settings.token is not None
    assert settings.token.reveal() == TOKEN


def test_token_from_consul_http_token_file(tmp_path: Path) -> None:
    path = write_token(tmp_path / "t.token", TOKEN)
    settings = resolve_settings(env={"CONSUL_HTTP_TOKEN_FILE": str(path)})
    assert settings.token is not None
    assert settings.token.reveal() == TOKEN


def test_token_file_flag_beats_both_environment_variables(tmp_path: Path) -> None:
    flag_file = write_token(tmp_path / "flag.token", "from-flag")
    env_file = write_token(tmp_path / "env.token", "from-env-file")
    env = {"CONSUL_HTTP_TOKEN": "from-env", "CONSUL_HTTP_TOKEN_FILE": str(env_file)}
    settings = resolve_settings(GivenSettings(token_file=flag_file), env=env)
    assert settings.token is not None
    assert settings.token.reveal() == "from-flag"


def test_consul_http_token_file_beats_consul_http_token(tmp_path: Path) -> None:
    """As Consul's own api.NewClient: a token file, when set, wins over CONSUL_HTTP_TOKEN."""
    env_file = write_token(tmp_path / "env.token", "from-env-file")
    env = {"CONSUL_HTTP_TOKEN": "from-env", "CONSUL_HTTP_TOKEN_FILE": str(env_file)}
    settings = resolve_settings(env=env)
    assert settings.token is not None
    assert settings.token.reveal() == "from-env-file"


@pytest.mark.parametrize("content", [None, "", "  \n\n"])
def test_missing_or_empty_token_file_is_an_input_error(tmp_path: Path, content: str | None) -> None:
    path = tmp_path / "token"
    if content is not None:
        path.write_text(content)
    with pytest.raises(InputError, match="token file"):
        resolve_settings(env={"CONSUL_HTTP_TOKEN_FILE": str(path)})
    with pytest.raises(InputError, match="token file"):
        resolve_settings(GivenSettings(token_file=path), env={})


def test_non_utf8_token_file_is_an_input_error(tmp_path: Path) -> None:
    path = tmp_path / "token"
    path.write_bytes(b"\xff\xfe\x00token")
    with pytest.raises(InputError, match="not UTF-8"):
        resolve_settings(GivenSettings(token_file=path), env={})


def test_settings_repr_masks_the_token() -> None:
    settings = resolve_settings(env={"CONSUL_HTTP_TOKEN": TOKEN})
    assert TOKEN not in repr(settings)
    assert TOKEN not in str(settings)
    assert MASK in repr(settings)


# --- TLS ------------------------------------------------------------------------------------


def test_tls_files_from_the_environment(pem_files: dict[str, Path]) -> None:
    env = {
        "CONSUL_CACERT": str(pem_files["ca"]),
        "CONSUL_CLIENT_CERT": str(pem_files["cert"]),
        "CONSUL_CLIENT_KEY": str(pem_files["key"]),
    }
    settings = resolve_settings(env=env)
    assert settings.ca_cert == pem_files["ca"]
    assert settings.client_cert == pem_files["cert"]
    assert settings.client_key == pem_files["key"]


def test_tls_flags_beat_the_environment(pem_files: dict[str, Path]) -> None:
    env = {
        "CONSUL_CACERT": str(pem_files["ca"]),
        "CONSUL_CLIENT_CERT": str(pem_files["cert"]),
        "CONSUL_CLIENT_KEY": str(pem_files["key"]),
        "CONSUL_HTTP_SSL_VERIFY": "true",
    }
    settings = resolve_settings(
        GivenSettings(
            ca_cert=pem_files["ca-flag"],
            client_cert=pem_files["cert-flag"],
            client_key=pem_files["key-flag"],
            verify_tls=False,
        ),
        env=env,
    )
    assert settings.ca_cert == pem_files["ca-flag"]
    assert settings.client_cert == pem_files["cert-flag"]
    assert settings.client_key == pem_files["key-flag"]
    assert settings.verify_tls is False


@pytest.mark.parametrize(
    ("value", "expected"),
    [("false", False), ("0", False), ("NO", False), ("true", True), ("1", True), (" on ", True)],
)
def test_consul_http_ssl_verify(value: str, expected: bool) -> None:
    assert resolve_settings(env={"CONSUL_HTTP_SSL_VERIFY": value}).verify_tls is expected


def test_verify_flag_true_beats_environment_false() -> None:
    env = {"CONSUL_HTTP_SSL_VERIFY": "false"}
    assert resolve_settings(GivenSettings(verify_tls=True), env=env).verify_tls is True


@pytest.mark.parametrize("value", ["maybe", "2", "yess"])
def test_bad_ssl_verify_value_is_an_input_error(value: str) -> None:
    with pytest.raises(InputError, match="CONSUL_HTTP_SSL_VERIFY"):
        resolve_settings(env={"CONSUL_HTTP_SSL_VERIFY": value})


def test_bad_consul_http_ssl_value_is_an_input_error() -> None:
    with pytest.raises(InputError, match="CONSUL_HTTP_SSL"):
        resolve_settings(env={"CONSUL_HTTP_SSL": "sometimes"})


def test_client_key_without_a_client_cert_is_an_input_error(pem_files: dict[str, Path]) -> None:
    with pytest.raises(InputError, match="CONSUL_CLIENT_KEY"):
        resolve_settings(env={"CONSUL_CLIENT_KEY": str(pem_files["key"])})


def test_client_cert_alone_is_allowed_as_a_combined_pem(pem_files: dict[str, Path]) -> None:
    settings = resolve_settings(env={"CONSUL_CLIENT_CERT": str(pem_files["cert"])})
    assert settings.client_cert == pem_files["cert"]
    assert settings.client_key is None


@pytest.mark.parametrize("variable", ["CONSUL_CACERT", "CONSUL_CLIENT_CERT", "CONSUL_CLIENT_KEY"])
def test_missing_tls_file_is_an_input_error(
    tmp_path: Path, pem_files: dict[str, Path], variable: str
) -> None:
    env = {"CONSUL_CLIENT_CERT": str(pem_files["cert"])}
    env[variable] = str(tmp_path / "does-not-exist.pem")
    with pytest.raises(InputError, match=r"does-not-exist\.pem"):
        resolve_settings(env=env)


# --- timeout --------------------------------------------------------------------------------


def test_timeout_flag() -> None:
    assert resolve_settings(GivenSettings(timeout=2.5), env={}).timeout == 2.5


@pytest.mark.parametrize("bad", [0.0, -1.0, math.nan, math.inf])
def test_bad_timeout_is_an_input_error(bad: float) -> None:
    with pytest.raises(InputError, match="timeout"):
        resolve_settings(GivenSettings(timeout=bad), env={})


# --- Secret and its files -------------------------------------------------------------------


def test_secret_repr_and_str_are_masked() -> None:
    secret = Secret(TOKEN)
    for shown in (repr(secret), str(secret), f"{secret}", f"{secret!r}", format(secret, "")):
        assert TOKEN not in shown
        assert MASK in shown
    assert secret.reveal() == TOKEN
    assert repr([secret]) == f"[Secret({MASK})]"


def test_secret_truthiness_follows_the_value() -> None:
    assert Secret("x")
    assert not Secret("")


def test_write_secret_file_is_0600_and_readable_back(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "management.token"
    write_secret_file(path, Secret(TOKEN))
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert read_secret_file(path).reveal() == TOKEN
    assert sorted(p.name for p in path.parent.iterdir()) == ["management.token"]


def test_write_secret_file_replaces_a_world_readable_file_with_a_0600_one(tmp_path: Path) -> None:
    path = tmp_path / "management.token"
    path.write_text("old\n")
    path.chmod(0o644)
    write_secret_file(path, Secret(TOKEN))
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert path.read_text() == TOKEN + "\n"


@pytest.mark.parametrize("failing", ["fsync", "replace", "chmod"])
def test_write_secret_file_failure_keeps_old_content_and_leaves_no_temp_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, failing: str
) -> None:
    path = tmp_path / "management.token"
    path.write_text("old-token\n")
    path.chmod(0o600)

    def broken(*args: object, **kwargs: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(f"provision.system.secrets.os.{failing}", broken)
    with pytest.raises(OSError, match="No space left"):
        write_secret_file(path, Secret(TOKEN))
    monkeypatch.undo()
    assert path.read_text() == "old-token\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["management.token"]
