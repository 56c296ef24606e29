"""The test suite as a JWT issuer (a Kubernetes cluster's service-account signer does the same):
an RSA key made with openssl, RS256 tokens with a projected service-account token's claims,
signed with `openssl dgst -sha256 -sign`. Consul really verifies them; no JWT library needed."""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
import time
from pathlib import Path

ISSUER = "https://issuer.test"
OPENSSL = shutil.which("openssl")


def make_key(folder: Path, name: str = "issuer") -> tuple[Path, Path]:
    """A new RSA key and its public key (PEM), as `folder/name.key` and `folder/name.pem`."""
    assert OPENSSL, "openssl makes the issuer's key"
    key, public = folder / f"{name}.key", folder / f"{name}.pem"
    subprocess.run([OPENSSL, "genrsa", "-out", str(key), "2048"], check=True, capture_output=True)
    subprocess.run(
        [OPENSSL, "rsa", "-in", str(key), "-pubout", "-out", str(public)],
        check=True,
        capture_output=True,
    )
    return key, public


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def sign_jwt(
    key: Path,
    namespace: str,
    account: str,
    *,
    audience: str = "consul",
    lifetime: int = 600,
    issued_ago: int = 0,
) -> str:
    """An RS256 JWT with a projected service-account token's claims, signed by `key`; it
    expired already when `issued_ago` is above `lifetime`."""
    assert OPENSSL, "openssl signs the token"
    now = int(time.time()) - issued_ago
    claims = {
        "iss": ISSUER,
        "aud": [audience],
        "sub": f"system:serviceaccount:{namespace}:{account}",
        "iat": now,
        "nbf": now - 5,
        "exp": now + lifetime,
        "kubernetes.io": {"namespace": namespace, "serviceaccount": {"name": account}},
    }
    header = {"alg": "RS256", "typ": "JWT"}
    signed = f"{_b64(json.dumps(header).encode())}.{_b64(json.dumps(claims).encode())}"
    signature = subprocess.run(
        [OPENSSL, "dgst", "-sha256", "-sign", str(key)],
        input=signed.encode(),
        check=True,
        capture_output=True,
    ).stdout
    return f"{signed}.{_b64(signature)}"


def write_jwt(path: Path, token: str) -> None:
    """Write the token as the platform projects it (mode 0600, replaced whole)."""
    staged = path.with_name(path.name + ".new")
    staged.write_text(token, encoding="utf-8")
    staged.chmod(0o600)
    staged.replace(path)
