"""`bytesplat-compare`: train the current recipe (baseline) and bytesplat (candidate) side by side on your scene,
on identical inputs, and say whether to switch, judged by limits you choose beforehand.

One pair of runs per seed (same data split, steps and seed; only the method differs), run baseline,
candidate, baseline, candidate, ... each in its own process. Held-out views are nerfstudio's eval split
and are never trained on. A run that fails is recorded with its error and the study goes on. Writes
report.md, report.json, a PSNR-against-training-time plot and every run's held-out renders to --output.
Options after `--` go to both methods' ns-train unchanged.
"""

from __future__ import annotations

import argparse
import dataclasses
import shutil
import sys
from pathlib import Path

from bytesplat_ns.compare.limits import DEFAULT_LIMITS, parse_limits
from bytesplat_ns.compare.records import RunRecord, RunSpec, StudyConfig, write_json
from bytesplat_ns.compare.stats import DERIVED

RESERVED = {
    "--data": "--data",
    "--pipeline.datamanager.data": "--data",
    "--max-num-iterations": "--steps",
    "--machine.seed": "--seeds",
    "--machine.device-type": "--device",
    "--machine.num-devices": "--num-devices",
    "--output-dir": "--output",
    "--experiment-name": "--output",
    "--timestamp": "--output",
    "--method-name": "--baseline/--candidate",
    "--vis": "(no viewer during a study)",
    "--steps-per-eval-image": "--eval-every",
    "--steps-per-eval-batch": "--eval-every",
    "--steps-per-eval-all-images": "--eval-every",
    "--load-dir": "(studies train from scratch)",
    "--load-checkpoint": "(studies train from scratch)",
    "--load-config": "(studies train from scratch)",
}
"""ns-train options the study sets itself -> the bytesplat-compare option to use instead."""


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="bytesplat-compare",
        usage="%(prog)s --data SCENE [options] [-- ns-train options for both methods]",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="quantities a limit can name (mean over pairs):\n"
        + "\n".join(f"  {k:<14} {v[2]}" for k, v in DERIVED.items())
        + "\n\nexample: %(prog)s --data data/garden --steps 7000 --seeds 3 -- --pipeline.model.sh-degree 3",
    )
    p.add_argument("--data", type=Path, required=True, help="scene folder, as for ns-train --data")
    p.add_argument("--baseline", default="splatfacto", help="current recipe: a nerfstudio method (default %(default)s)")
    p.add_argument("--candidate", default="bytesplat", help="method considered instead (default %(default)s)")
    p.add_argument("--steps", type=int, default=7000, help="training steps of every run (default %(default)s)")
    p.add_argument("--seeds", type=int, default=3, help="number of pairs, one seed each (default %(default)s)")
    p.add_argument("--first-seed", type=int, default=42, help="seed of the first pair, then +1 (default %(default)s)")
    p.add_argument("--num-devices", type=int, default=1, help="GPUs per run (default %(default)s)")
    p.add_argument(
        "--limits",
        default=DEFAULT_LIMITS,
        help="preselected limits, all must hold to switch (default %(default)s)",
    )
    p.add_argument("--output", type=Path, default=Path("compare-output"), help="report folder (default %(default)s)")
    p.add_argument(
        "--eval-every",
        type=int,
        default=None,
        help="evaluate held-out PSNR every this many steps for the PSNR-time curves (default steps/10)",
    )
    p.add_argument(
        "--device",
        choices=("auto", "cpu", "cuda"),
        default="auto",
        help="device type of every run; auto: cuda when a GPU is visible, else cpu",
    )
    p.add_argument(
        "--worse-db",
        type=float,
        default=0.5,
        help="show views where the candidate is worse by more than this many dB (default %(default)s)",
    )
    p.add_argument("--run-timeout", type=float, default=None, help="stop a run after this many seconds (failed)")
    return p


def split_extra(argv: list[str]) -> tuple[list[str], list[str]]:
    """(bytesplat-compare's own arguments, the ns-train options after the first `--`)."""
    if "--" in argv:
        at = argv.index("--")
        return argv[:at], argv[at + 1 :]
    return argv, []


def reserved_options(extra: list[str]) -> list[str]:
    """The ns-train options in `extra` that the study sets itself, each with what to use instead."""
    found = []
    for token in extra:
        name = token.split("=", 1)[0].replace("_", "-")
        if name in RESERVED:
            found.append(f"{token.split('=', 1)[0]} (use {RESERVED[name]})")
    return found


def study_from_args(args: argparse.Namespace, extra: list[str]) -> StudyConfig:
    device = args.device
    if device == "auto":
        import torch

        device = "cuda" if torch.cuda.is_available() else "cpu"
    return StudyConfig(
        data=str(args.data.resolve()),
        baseline=args.baseline,
        candidate=args.candidate,
        steps=args.steps,
        seeds=[args.first_seed + i for i in range(args.seeds)],
        eval_every=args.eval_every or max(1, args.steps // 10),
        device=device,
        num_devices=args.num_devices,
        limits=args.limits,
        extra_args=extra,
        output=str(args.output.resolve()),
        worse_db=args.worse_db,
        run_timeout_s=args.run_timeout,
    )


STUDY_FILE = "study.json"
"""Marks a folder as a study's output; written first, before any run."""
OWN_ENTRIES = ("runs", "heldout_gt", "worse_views", "report.md", "report.json", "psnr_vs_time.png", STUDY_FILE)


def output_problem(output: Path) -> str | None:
    """Why the output folder cannot take a study: only a new or empty folder, or an earlier study's, can."""
    if output.exists() and not output.is_dir():
        return f"--output {output} is a file"
    if output.is_dir() and any(output.iterdir()) and not (output / STUDY_FILE).exists():
        return f"--output {output} is not empty and holds no earlier study ({STUDY_FILE}): choose a new folder"
    return None


def clear_output(output: Path) -> None:
    """Remove an earlier study's outputs from the folder, so no stale run or ground truth mixes in."""
    for name in OWN_ENTRIES:
        path = output / name
        if path.is_dir():
            shutil.rmtree(path)
        elif path.exists():
            path.unlink()
    output.mkdir(parents=True, exist_ok=True)


def run_specs(study: StudyConfig) -> list[RunSpec]:
    """The study's runs in order: per seed, the baseline then the candidate."""
    output = Path(study.output)
    specs = []
    for pair, seed in enumerate(study.seeds):
        for role, method in (("baseline", study.baseline), ("candidate", study.candidate)):
            specs.append(
                RunSpec(
                    method=method,
                    role=role,
                    seed=seed,
                    pair=pair,
                    data=study.data,
                    steps=study.steps,
                    eval_every=study.eval_every,
                    device=study.device,
                    num_devices=study.num_devices,
                    extra_args=list(study.extra_args),
                    output_dir=study.output,
                    run_dir=str(output / "runs" / f"seed{seed}-{role}-{method}"),
                    gt_dir=str(output / "heldout_gt"),
                )
            )
    return specs


def compare(argv: list[str] | None = None) -> dict:
    """Run the study the arguments describe; returns the report (as written to report.json)."""
    own, extra = split_extra(sys.argv[1:] if argv is None else list(argv))
    p = parser()
    args = p.parse_args(own)
    try:
        parse_limits(args.limits)
    except ValueError as error:
        p.error(str(error))
    if min(args.steps, args.seeds, args.num_devices, args.eval_every or 1) < 1:
        p.error("--steps, --seeds, --num-devices and --eval-every must be at least 1")
    if not args.data.exists():
        p.error(f"--data {args.data}: no such folder or file")
    if reserved := reserved_options(extra):
        p.error("these ns-train options are set by bytesplat-compare: " + ", ".join(reserved))
    if problem := output_problem(args.output):
        p.error(problem)
    from nerfstudio.configs.method_configs import all_methods

    for method in (args.baseline, args.candidate):
        if method not in all_methods:
            p.error(f"unknown method {method!r}; registered: {', '.join(sorted(all_methods))}")

    from bytesplat_ns.compare.report import write_report
    from bytesplat_ns.compare.runner import run_one

    study = study_from_args(args, extra)
    clear_output(Path(study.output))
    write_json(Path(study.output) / STUDY_FILE, dataclasses.asdict(study))
    specs = run_specs(study)
    runs: list[RunRecord] = []
    for number, spec in enumerate(specs, 1):
        what = f"{spec.role} {spec.method}, seed {spec.seed}, {spec.steps} steps on {spec.device}"
        print(f"[{number}/{len(specs)}] {what}", flush=True)
        try:
            run = run_one(spec, timeout_s=study.run_timeout_s)
        except KeyboardInterrupt:
            print(f"Interrupted: no more runs; reporting the {len(runs)} finished (their pairs are incomplete).")
            break
        runs.append(run)
        if run.status == "ok":
            print(
                f"    held-out PSNR {run.psnr:.2f} dB, start-up {run.startup_s:.1f} s, training {run.train_s:.1f} s, "
                f"{run.splats} splats"
            )
        else:
            print(f"    FAILED (recorded; the study goes on): {(run.error or '?').splitlines()[-1]}")
    report = write_report(study, runs, planned=len(specs))
    print(f"\n{report['verdict']}")
    for reason in report["reasons"]:
        print(f"  - {reason}")
    print(f"Report: {Path(study.output) / 'report.md'} (and report.json)")
    return report


def main(argv: list[str] | None = None) -> None:
    """Console entry point (exits 0 whatever the verdict; the verdict is in report.json)."""
    compare(argv)


if __name__ == "__main__":
    main()
