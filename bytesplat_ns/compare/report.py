"""A study's report: paired statistics, the verdict, report.json, report.md, the PSNR-time plot and the
side-by-side pictures of the views where the candidate is worse."""

from __future__ import annotations

import dataclasses
import shutil
from collections.abc import Sequence
from pathlib import Path

from bytesplat_ns.compare.figures import plot_psnr_curves, side_by_side
from bytesplat_ns.compare.limits import decide, parse_limits
from bytesplat_ns.compare.records import RunRecord, StudyConfig, write_json
from bytesplat_ns.compare.stats import (
    DERIVED,
    METRICS,
    Pair,
    as_json,
    derived_quantities,
    fill_time_to_target,
    make_pairs,
    metric_table,
    worse_views,
)

PLOT = "psnr_vs_time.png"
WORSE_VIEWS = "worse_views"
"""Folder of the side-by-side pictures; it holds only those of the latest report."""
UNITS = {
    "psnr": ("dB", "{:.2f}"),
    "ssim": ("", "{:.4f}"),
    "lpips": ("", "{:.4f}"),
    "train_s": ("s", "{:.2f}"),
    "startup_s": ("s", "{:.2f}"),
    "step_ms": ("ms", "{:.1f}"),
    "peak_mem": ("MiB", "{:.0f}"),
    "splats": ("", "{:.0f}"),
    "time_to_target": ("s", "{:.2f}"),
    "bytes_exchanged": ("MiB", "{:.1f}"),
}
"""metric -> (unit shown in report.md, format); peak_mem and bytes_exchanged are stored in bytes, shown in MiB."""


def _shown(metric: str, value: float | None) -> str:
    if value is None:
        return "n/a"
    return UNITS[metric][1].format(value / 2**20 if metric in ("peak_mem", "bytes_exchanged") else value)


def failure_lines(runs: Sequence[RunRecord]) -> list[str]:
    """One line per failed run: who, and the last line of its output."""
    lines = []
    for run in runs:
        if run.status != "ok":
            last = (run.error or "no error recorded").strip().splitlines()[-1]
            lines.append(f"{run.label}: {last}")
    return lines


def _gpus(gpus: list[int] | None) -> str:
    return "no --devices" if gpus is None else "GPU " + ",".join(map(str, gpus))


def fairness_problems(pairs: Sequence[Pair], steps: int, planned: int | None = None) -> list[str]:
    """Runs missing (an interrupted study) and differences within a pair other than the method."""
    done = sum((p.baseline is not None) + (p.candidate is not None) for p in pairs)
    problems = [f"the study was interrupted: {done} of {planned} runs made"] if planned and done < planned else []
    for pair in pairs:
        if not pair.complete:
            continue
        if pair.baseline.heldout_views != pair.candidate.heldout_views:
            problems.append(f"seed {pair.seed}: the two runs saw different held-out views")
        if pair.baseline.gpus != pair.candidate.gpus:
            gpus = [_gpus(run.gpus) for run in (pair.baseline, pair.candidate)]
            problems.append(f"seed {pair.seed}: the two runs had different GPUs ({gpus[0]} and {gpus[1]})")
        for run in (pair.baseline, pair.candidate):
            if run.steps != steps:
                problems.append(f"{run.label} stopped after {run.steps} of {steps} steps")
    return problems


def build_report(study: StudyConfig, runs: Sequence[RunRecord], planned: int | None = None) -> dict:
    """Everything report.json holds; also writes the plot and the side-by-side pictures into study.output.
    planned: how many runs the study meant to make (fewer runs: it was interrupted, and the verdict says so)."""
    output = Path(study.output)
    pairs = make_pairs(runs)
    fill_time_to_target(pairs)
    derived = derived_quantities(pairs)
    problems = fairness_problems(pairs, study.steps, planned)
    verdict = decide(parse_limits(study.limits), derived, failure_lines(runs), problems)
    worse = worse_views(pairs, study.worse_db)
    shutil.rmtree(output / WORSE_VIEWS, ignore_errors=True)  # an earlier report's pictures (a resumed study)
    for item in worse:
        picture = Path(WORSE_VIEWS) / f"seed{item['seed']}-{Path(item['view']).stem}.png"
        images = [output / item["gt"], output / item["baseline_render"], output / item["candidate_render"]]
        side_by_side(images, ["ground truth", study.baseline, study.candidate], output / picture)
        item["side_by_side"] = str(picture)
    plot_psnr_curves(runs, output / PLOT)
    heldout = next((r.heldout_views for r in runs if r.status == "ok"), [])
    return {
        "verdict": verdict.decision,
        "reasons": verdict.reasons,
        "limits": as_json(verdict.checks),
        "study": dataclasses.asdict(study),
        "heldout_views": heldout,
        "metrics": as_json(metric_table(pairs)),
        "derived": as_json(derived),
        "worse_views": worse,
        "plot": PLOT,
        "notes": sorted({note for run in runs for note in run.notes}),
        "runs": [run.to_dict() for run in runs],
    }


def _lanes_lines(lanes: list[list[int]] | None) -> list[str]:
    """How the runs were spread over GPUs (--devices), for the set-up section; nothing without --devices."""
    if not lanes:
        return []
    gpus = " | ".join(",".join(map(str, lane)) for lane in lanes)
    how = f"concurrently on {len(lanes)} lanes" if len(lanes) > 1 else "on 1 lane"
    return [
        f"- Pairs ran {how}: GPUs {gpus} (pair i on lane i mod {len(lanes)}; within a lane baseline then "
        "candidate, both on the lane's GPUs, given through CUDA_VISIBLE_DEVICES)"
    ]


def markdown(report: dict) -> str:
    study = report["study"]
    base, cand = study["baseline"], study["candidate"]
    lines = [
        f"# {base} vs {cand}: {report['verdict']}",
        "",
        *[f"- {reason}" for reason in report["reasons"]],
        "",
        "## Set-up",
        "",
        f"- Scene: `{study['data']}`",
        f"- Baseline `{base}`, candidate `{cand}`; {study['steps']} steps, seeds {study['seeds']} (one pair per seed, "
        f"run baseline, candidate, baseline, ...); device {study['device']} x {study['num_devices']}",
        *_lanes_lines(study.get("lanes")),
        f"- Extra ns-train options (both methods): `{' '.join(study['extra_args']) or '(none)'}`",
        f"- Held-out PSNR evaluated every {study['eval_every']} steps and after the last; evaluation time is "
        "excluded from training time",
        f"- Limits chosen beforehand: `{study['limits']}`",
        *[f"- Note: {note}" for note in report["notes"]],
        "",
        "## Limits",
        "",
        "| limit | measured | holds | meaning / note |",
        "|---|---|---|---|",
    ]
    for check in report["limits"]:
        measured = "n/a" if check["measured"] is None else f"{check['measured']:.4g}"
        lines.append(f"| `{check['limit']}` | {measured} | {'yes' if check['holds'] else 'NO'} | {check['note']} |")
    lines += ["", "Derived quantities (mean over pairs where both runs succeeded):", ""]
    for name, item in report["derived"].items():
        value = "n/a" if item["value"] is None else f"{item['value']:.4g}"
        why = f" ({item['note']})" if item["value"] is None else ""
        lines.append(f"- `{name}` = {value}: {DERIVED[name][2]}{why}")
    lines += [
        "",
        "## Metrics",
        "",
        "Mean ± std across seeds (std needs two seeds); diff = candidate - baseline, mean ± std over pairs.",
        "",
        f"| metric | {base} (baseline) | {cand} (candidate) | diff |",
        "|---|---|---|---|",
    ]
    for metric in METRICS:
        row = report["metrics"][metric]
        unit = UNITS[metric][0]
        cells = []
        for key in ("baseline", "candidate", "diff"):
            mean, std = row[key]["mean"], row[key]["std"]
            cells.append(_shown(metric, mean) + ("" if std is None else f" ± {_shown(metric, std)}"))
        lines.append(f"| {metric}{f' [{unit}]' if unit else ''} | " + " | ".join(cells) + " |")
    lines += ["", f"![held-out PSNR against training time]({report['plot']})", "", "## Runs", ""]
    lines += ["| run | status | PSNR [dB] | start-up [s] | train [s] | time to target [s] | splats | folder |"]
    lines += ["|---|---|---|---|---|---|---|---|"]
    for run in report["runs"]:
        label = f"{run['role']} {run['method']} seed {run['seed']}"
        cells = [_shown(m, run[m]) for m in ("psnr", "startup_s", "train_s", "time_to_target", "splats")]
        lines.append(f"| {label} | {run['status']} | " + " | ".join(cells) + f" | `{run['run_dir']}` |")
    for run in report["runs"]:
        if run["status"] != "ok":
            lines += ["", f"Error of {run['role']} {run['method']} seed {run['seed']}:", "", "```", run["error"], "```"]
    lines += ["", f"## Held-out views ({len(report['heldout_views'])}, never trained on)", ""]
    lines += [f"- `{name}`" for name in report["heldout_views"]] or ["- (no run succeeded)"]
    worse = report["worse_views"]
    lines += ["", f"## Views where the candidate is worse by more than {study['worse_db']} dB ({len(worse)})", ""]
    if not worse:
        lines.append("None.")
    for item in worse:
        lines += [
            f"- `{item['view']}`, seed {item['seed']}: {item['baseline_psnr']:.2f} -> {item['candidate_psnr']:.2f} dB "
            f"(-{item['drop_db']:.2f} dB). Ground truth | baseline | candidate:",
            "",
            f"  ![{item['view']}]({item['side_by_side']})",
        ]
    return "\n".join(lines) + "\n"


def write_report(study: StudyConfig, runs: Sequence[RunRecord], planned: int | None = None) -> dict:
    """Build the report and write report.json and report.md into the study's output folder."""
    report = build_report(study, runs, planned)
    output = Path(study.output)
    write_json(output / "report.json", report)
    (output / "report.md").write_text(markdown(report))
    return report
