"""`lockctl verify`: prove on a live cluster that the locks and ACLs do what the spec promises.

Checks run concurrently (each uses its own sessions and keys), so the wall time is close to the
longest inherent wait (LockDelay, TTL expiry). Whatever happens, every session and key a check
made is destroyed at the end.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from provision.consul.errors import ConsulError
from provision.errors import InputError
from provision.verify.checks import CHECKS, Check
from provision.verify.context import VerifyContext
from provision.verify.evidence import CheckFailed, CheckSkipped, Evidence


@dataclass(frozen=True)
class CheckResult:
    name: str
    status: str  # pass, fail, skip
    summary: str
    evidence: tuple[str, ...]
    warnings: tuple[str, ...]
    seconds: float

    def to_record(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "status": self.status,
            "summary": self.summary,
            "seconds": round(self.seconds, 3),
            "evidence": list(self.evidence),
            "warnings": list(self.warnings),
        }


@dataclass(frozen=True)
class VerifyReport:
    results: tuple[CheckResult, ...]
    seconds: float
    leftovers: int  # sessions the cleanup could not destroy (they expire with their TTL)

    @property
    def passed(self) -> bool:
        return all(result.status != "fail" for result in self.results)

    def to_record(self) -> dict[str, Any]:
        """The JSON record of `lockctl verify --json`."""
        return {
            "passed": self.passed,
            "seconds": round(self.seconds, 3),
            "leftover_sessions": self.leftovers,
            "checks": [result.to_record() for result in self.results],
        }


def select_checks(only: Sequence[str], slow: bool) -> list[Check]:
    """The checks to run: --only names (any, slow ones too), else every check but the slow."""
    names = [check.name for check in CHECKS]
    unknown = [name for name in only if name not in names]
    if unknown:
        raise InputError(f"--only {unknown[0]}: no such check (checks: {', '.join(names)})")
    if only:
        return [check for check in CHECKS if check.name in only]
    return [check for check in CHECKS if slow or not check.slow]


def run_verification(ctx: VerifyContext, checks: Sequence[Check]) -> VerifyReport:
    """Run `checks`; raises `ConsulUnavailable` first, within one client timeout, when an agent
    they need does not answer."""
    began = time.monotonic()
    ctx.require_reachable()
    try:
        with ThreadPoolExecutor(max_workers=max(1, len(checks))) as pool:
            futures = [pool.submit(_run_one, ctx, check) for check in checks]
            results = tuple(future.result() for future in futures)
    finally:
        leftovers = ctx.cleanup.run()
    return VerifyReport(results, time.monotonic() - began, leftovers)


def _run_one(ctx: VerifyContext, check: Check) -> CheckResult:
    evidence = Evidence()
    started = time.monotonic()
    try:
        summary, status = check.run(ctx, evidence), "pass"
    except CheckSkipped as skipped:
        summary, status = str(skipped), "skip"
    except CheckFailed as failed:
        summary, status = str(failed), "fail"
    except ConsulError as error:
        summary, status = f"Consul error: {error}", "fail"
    return CheckResult(
        check.name,
        status,
        summary,
        tuple(evidence.lines),
        tuple(evidence.warnings),
        time.monotonic() - started,
    )
