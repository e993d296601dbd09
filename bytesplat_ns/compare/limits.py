"""The limits chosen before a study ("psnr_drop<=0.1,speedup>=1.5") and the verdict they give."""

from __future__ import annotations

import math
import operator
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from bytesplat_ns.compare.stats import DERIVED, Derived

DEFAULT_LIMITS = "psnr_drop<=0.1,ssim_drop<=0.002,speedup>=1.5"
KEEP, RETAIN = "KEEP", "RETAIN BASELINE"
OPERATORS = {"<=": operator.le, ">=": operator.ge, "<": operator.lt, ">": operator.gt}
_LIMIT = re.compile(r"^\s*([a-z_]+)\s*(<=|>=|<|>)\s*([-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)\s*$")


@dataclass(frozen=True)
class Limit:
    """One preselected limit: `quantity op value`, e.g. psnr_drop <= 0.1."""

    quantity: str
    """A name in stats.DERIVED (psnr_drop, ssim_drop, lpips_rise, speedup, train_speedup, mem_ratio)."""
    op: str
    """One of <=, >=, <, >."""
    value: float
    """The bound, in the quantity's own units."""

    def holds(self, measured: float | None) -> bool:
        """False when the quantity was not measured: a limit that cannot be checked does not hold."""
        return measured is not None and math.isfinite(measured) and OPERATORS[self.op](measured, self.value)

    def __str__(self) -> str:
        return f"{self.quantity}{self.op}{self.value:g}"


def parse_limits(text: str) -> list[Limit]:
    """Comma-separated limits; raises ValueError naming the bad part and the known quantities."""
    limits = []
    for part in text.split(","):
        if not part.strip():
            continue
        match = _LIMIT.match(part)
        if match is None:
            raise ValueError(f"Cannot read the limit {part.strip()!r}: write it as name<=number (or >=, <, >).")
        name, op, value = match.groups()
        if name not in DERIVED:
            raise ValueError(f"Unknown quantity {name!r} in limit {part.strip()!r}; known: {', '.join(DERIVED)}.")
        limits.append(Limit(name, op, float(value)))
    if not limits:
        raise ValueError("No limits given: name at least one, e.g. psnr_drop<=0.1.")
    return limits


@dataclass
class LimitCheck:
    """One limit against what the study measured."""

    limit: str
    """The limit as written, e.g. psnr_drop<=0.1."""
    measured: float | None
    """The quantity's mean over pairs; None when not measured."""
    holds: bool
    """Whether the limit holds (never when not measured)."""
    note: str = ""
    """Why it was not measured, or what the quantity means."""


@dataclass
class Verdict:
    """KEEP (switch to the candidate) when every limit holds and every run succeeded, else RETAIN BASELINE."""

    decision: str
    """KEEP or RETAIN BASELINE."""
    reasons: list[str] = field(default_factory=list)
    """Why: the limits that failed and the runs that failed, or that every limit held."""
    checks: list[LimitCheck] = field(default_factory=list)
    """Each limit with its measured value."""


def decide(
    limits: Sequence[Limit],
    derived: Mapping[str, Derived],
    failures: Sequence[str] = (),
    problems: Sequence[str] = (),
) -> Verdict:
    """The verdict from the limits, the derived quantities, the failed runs (one line each) and any other problem
    that makes the comparison unfair (one line each, e.g. a pair whose runs saw different held-out views)."""
    checks = []
    for limit in limits:
        quantity = derived.get(limit.quantity, Derived(None, [], "not computed"))
        checks.append(LimitCheck(str(limit), quantity.value, limit.holds(quantity.value), quantity.note))
    reasons = [f"run failed: {line}" for line in failures] + list(problems)
    for check in checks:
        if check.holds:
            continue
        if check.measured is None:
            reasons.append(f"limit {check.limit} failed: not measured ({check.note})")
        else:
            reasons.append(f"limit {check.limit} failed: measured {check.measured:.4g}")
    if reasons:
        return Verdict(RETAIN, reasons, checks)
    held = ", ".join(f"{c.limit} (measured {c.measured:.4g})" for c in checks)
    return Verdict(KEEP, [f"every limit holds: {held}"], checks)
