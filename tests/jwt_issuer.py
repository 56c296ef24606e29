"""The test suite as a JWT issuer (a Kubernetes cluster's service-account signer does the same):
an RSA key it makes, RS256 tokens with a projected service-account token's claims, signed with
PyJWT. Consul really verifies them."""

from __future__ import annotations

import time
from pathlib import Path

import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

ISSUER = "https://issuer.test"


def make_key(folder: Path, name: str = "issuer") -> tuple[Path, Path]:
    """A new RSA key and its public key (PEM), as `folder/name.key` (0600) and `folder/name.pem`."""
    private = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    key, public = folder / f"{name}.key", folder / f"{name}.pem"
    key.write_bytes(
        private.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    key.chmod(0o600)
    public.write_bytes(
        private.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    return key, public


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
    return jwt.encode(claims, key.read_bytes(), algorithm="RS256")


def write_jwt(path: Path, token: str) -> None:
    """Write the token as the platform projects it (mode 0600, replaced whole)."""
    staged = path.with_name(path.name + ".new")
    staged.write_text(token, encoding="utf-8")
    staged.chmod(0o600)
    staged.replace(path)
