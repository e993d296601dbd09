"""Paired statistics over a study's runs: per-method spread across seeds, candidate - baseline per pair,
time-to-target, and the derived quantities the limits are written in (psnr_drop, speedup, ...)."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

from bytesplat_ns.compare.records import CurvePoint, RunRecord

METRICS = ("psnr", "ssim", "lpips", "train_s", "startup_s", "step_ms", "peak_mem", "splats", "time_to_target",
           "bytes_exchanged")  # fmt: skip
"""Per-run quantities reported for each method and as paired differences (candidate - baseline)."""


@dataclass
class Spread:
    """Mean and sample standard deviation (n - 1) of the values that exist; None where there are too few."""

    mean: float | None
    """Mean of the values (None when there is none)."""
    std: float | None
    """Sample standard deviation (None with fewer than two values)."""
    n: int
    """How many values there were."""


def spread(values: Sequence[float | None]) -> Spread:
    kept = [float(v) for v in values if v is not None and math.isfinite(v)]
    if not kept:
        return Spread(None, None, 0)
    mean = sum(kept) / len(kept)
    std = math.sqrt(sum((v - mean) ** 2 for v in kept) / (len(kept) - 1)) if len(kept) > 1 else None
    return Spread(mean, std, len(kept))


@dataclass
class Pair:
    """The baseline and candidate runs that share a seed (either may be missing or failed)."""

    seed: int
    """machine.seed of both runs."""
    baseline: RunRecord | None
    """The baseline's run."""
    candidate: RunRecord | None
    """The candidate's run."""

    @property
    def complete(self) -> bool:
        """Both runs trained and were evaluated."""
        return all(r is not None and r.status == "ok" for r in (self.baseline, self.candidate))


def make_pairs(runs: Sequence[RunRecord]) -> list[Pair]:
    """Group runs by pair index, in pair order."""
    pairs: dict[int, Pair] = {}
    for run in runs:
        pair = pairs.setdefault(run.pair, Pair(run.seed, None, None))
        setattr(pair, run.role, run)
    return [pairs[k] for k in sorted(pairs)]


def time_to_target(curve: Sequence[CurvePoint], target: float) -> float | None:
    """Training time [s] of the first evaluation whose held-out PSNR reached `target` [dB]; None if none did."""
    for point in curve:
        if point.psnr >= target:
            return point.train_s
    return None


def fill_time_to_target(pairs: Sequence[Pair]) -> None:
    """Target of each pair: its baseline's final held-out PSNR. The baseline's own time-to-target is when it first
    reached that PSNR (at most its training time); the candidate's is when it first matched it."""
    for pair in pairs:
        base = pair.baseline
        if base is None or base.status != "ok" or base.psnr is None:
            continue
        for run in (base, pair.candidate):
            if run is not None and run.status == "ok":
                run.target_psnr = base.psnr
                run.time_to_target = time_to_target(run.curve, base.psnr)


def metric_table(pairs: Sequence[Pair]) -> dict[str, dict[str, Spread]]:
    """metric -> {"baseline": spread over seeds, "candidate": ..., "diff": candidate - baseline over complete pairs}."""
    table = {}
    for metric in METRICS:
        row = {}
        for role in ("baseline", "candidate"):
            runs = [getattr(p, role) for p in pairs]
            row[role] = spread([getattr(r, metric) for r in runs if r is not None and r.status == "ok"])
        row["diff"] = spread([_paired(p, lambda b, c: c - b, metric) for p in pairs])
        table[metric] = row
    return table


def _paired(pair: Pair, combine: Callable[[float, float], float | None], metric: str) -> float | None:
    """combine(baseline value, candidate value) for a complete pair where both values exist, else None."""
    if not pair.complete:
        return None
    b, c = getattr(pair.baseline, metric), getattr(pair.candidate, metric)
    if b is None or c is None:
        return None
    try:
        return combine(float(b), float(c))
    except ZeroDivisionError:
        return None


@dataclass
class Derived:
    """A quantity the limits can name, with its value per complete pair."""

    value: float | None
    """Mean over the complete pairs; None when it could not be measured (see `note`)."""
    per_pair: list[float | None]
    """Value of each complete pair, in pair order."""
    note: str = ""
    """Why the value is None, or how it was formed."""


DERIVED = {
    "psnr_drop": ("psnr", lambda b, c: b - c, "baseline - candidate held-out PSNR [dB]"),
    "ssim_drop": ("ssim", lambda b, c: b - c, "baseline - candidate held-out SSIM"),
    "lpips_rise": ("lpips", lambda b, c: c - b, "candidate - baseline held-out LPIPS"),
    "speedup": ("time_to_target", lambda b, c: b / c, "baseline time to its final PSNR / candidate time to it"),
    "train_speedup": ("train_s", lambda b, c: b / c, "baseline / candidate training time for the same steps"),
    "mem_ratio": ("peak_mem", lambda b, c: c / b, "candidate / baseline peak GPU memory"),
}
"""name -> (per-run metric, how a pair combines (baseline, candidate), meaning)."""


def derived_quantities(pairs: Sequence[Pair]) -> dict[str, Derived]:
    """Each DERIVED quantity, as the mean over complete pairs; None if any complete pair lacks it (e.g. the
    candidate never reached the baseline's PSNR, or LPIPS was not measured)."""
    complete = [p for p in pairs if p.complete]
    out = {}
    for name, (metric, combine, meaning) in DERIVED.items():
        values = [_paired(p, combine, metric) for p in complete]
        missing = sum(v is None for v in values)
        if not complete:
            out[name] = Derived(None, [], "no pair where both runs succeeded")
        elif missing:
            why = f"not measured in {missing} of {len(complete)} pair(s)"
            if name == "speedup":
                why = f"the candidate never reached the baseline's final PSNR in {missing} of {len(complete)} pair(s)"
            out[name] = Derived(None, values, why)
        else:
            out[name] = Derived(sum(values) / len(values), values, meaning)
    return out


def worse_views(pairs: Sequence[Pair], threshold_db: float) -> list[dict]:
    """Held-out views where the candidate's PSNR is below the baseline's by more than threshold_db, per pair."""
    found = []
    for pair in pairs:
        if not pair.complete:
            continue
        base = {v.name: v for v in pair.baseline.views}
        for view in pair.candidate.views:
            ref = base.get(view.name)
            if ref is not None and ref.psnr - view.psnr > threshold_db:
                found.append({
                    "seed": pair.seed,
                    "view": view.name,
                    "baseline_psnr": ref.psnr,
                    "candidate_psnr": view.psnr,
                    "drop_db": ref.psnr - view.psnr,
                    "gt": ref.gt,
                    "baseline_render": ref.render,
                    "candidate_render": view.render,
                })  # fmt: skip
    return found


def as_json(value):
    """Dataclasses (Spread, Derived) nested in dicts and lists, as plain JSON values."""
    if isinstance(value, dict):
        return {k: as_json(v) for k, v in value.items()}
    if isinstance(value, list):
        return [as_json(v) for v in value]
    if hasattr(value, "__dataclass_fields__"):
        return asdict(value)
    return value
