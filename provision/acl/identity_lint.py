"""The identity lint: a binding rule whose selector could match another worker's identity.

A worker's selector requires its claims and nothing else, so a JWT carrying another worker's
claims matches it too when its claims are a subset of the other's (or equal): that login would
get both roles. Pure; findings use `acl.lint`'s Finding so `lockctl lint` prints them alike.
"""

from __future__ import annotations

from provision.acl.lint import Finding
from provision.spec.models import Spec

RULE = "identity-overlap"


def lint_identities(spec: Spec) -> list[Finding]:
    """One error per ordered pair (A, B) of workers of one auth method where A's selector
    matches B's identity: every claim A requires, B carries with the same value."""
    findings: list[Finding] = []
    workers = [w for w in spec.workers if w.identity is not None]
    for one in workers:
        for other in workers:
            if other is one or one.identity is None or other.identity is None:
                continue
            if one.identity.auth_method != other.identity.auth_method:
                continue
            if set(one.identity.claims) <= set(other.identity.claims):
                same = set(one.identity.claims) == set(other.identity.claims)
                relation = "the same claims as" if same else "a subset of the claims of"
                findings.append(
                    Finding(
                        "error",
                        one.identity.line,
                        RULE,
                        f'worker "{one.name}"\'s binding rule also matches worker '
                        f'"{other.name}"\'s identity (it requires {relation} "{other.name}"): '
                        f"a login as {other.name} would get both roles",
                        f'give worker "{one.name}" a claim that "{other.name}" does not carry '
                        "(e.g. its own service_account)",
                    )
                )
    return findings
