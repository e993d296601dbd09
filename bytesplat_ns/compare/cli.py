"""`bytesplat-compare`: train the current recipe (baseline) and bytesplat (candidate) side by side on your scene,
on identical inputs, and say whether to switch, judged by limits you choose beforehand.

One pair of runs per seed (same data split, steps and seed; only the method differs), run baseline,
candidate, baseline, candidate, ... each in its own process. Held-out views are nerfstudio's eval split
and are never trained on. A run that fails is recorded with its error and the study goes on. Writes
report.md, report.json, a PSNR-against-training-time plot and every run's held-out renders to --output.
Options after `--` go to both methods' ns-train unchanged.

--devices 0,1 runs pairs side by side, one lane of --num-devices GPUs each (both runs of a pair on the same GPUs).
Running again with the same options and --output resumes the study: finished runs are reused, failed or missing
ones are run, and the report is rebuilt from all of them.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import threading
from pathlib import Path

from bytesplat_ns.compare.lanes import devices_problem, lane_of_pair, parse_devices, plan_lanes, run_lanes
from bytesplat_ns.compare.limits import DEFAULT_LIMITS, parse_limits
from bytesplat_ns.compare.records import RunRecord, RunSpec, StudyConfig, write_json
from bytesplat_ns.compare.resume import STUDY_FILE, earlier_study_problem, output_problem, reusable
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
        "--devices",
        default=None,
        help="GPU indices to spread the pairs over, e.g. 0,1: lanes of --num-devices GPUs run side by side, pair i "
        "on lane i mod lanes, baseline then candidate (default: one run at a time, CUDA_VISIBLE_DEVICES as it is)",
    )
    p.add_argument(
        "--limits",
        default=DEFAULT_LIMITS,
        help="preselected limits, all must hold to switch (default %(default)s)",
    )
    p.add_argument(
        "--output",
        type=Path,
        default=Path("compare-output"),
        help="report folder; the same options again resume the study there (default %(default)s)",
    )
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


def resolve_device(device: str) -> str:
    """--device as the runs get it: auto is cuda when a GPU is visible, else cpu."""
    if device != "auto":
        return device
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def study_lanes(devices: str, per_run: int, device: str, num_pairs: int) -> list[list[int]]:
    """The lanes --devices gives (no more than there are pairs); raises ValueError naming the fix.
    device: --device as given (auto, cpu or cuda)."""
    listed = parse_devices(devices)
    available = 0
    if device != "cpu":
        import torch

        available = torch.cuda.device_count()
    if problem := devices_problem(listed, per_run, device, available):
        raise ValueError(problem)
    return plan_lanes(listed, per_run)[:num_pairs]


def study_from_args(
    args: argparse.Namespace, extra: list[str], device: str, lanes: list[list[int]] | None = None
) -> StudyConfig:
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
        lanes=lanes,
    )


def run_specs(study: StudyConfig) -> list[RunSpec]:
    """The study's runs in order: per seed, the baseline then the candidate (on the pair's lane, if any)."""
    output = Path(study.output)
    specs = []
    for pair, seed in enumerate(study.seeds):
        gpus = study.lanes[lane_of_pair(pair, len(study.lanes))] if study.lanes else None
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
                    gpus=gpus,
                )
            )
    return specs


def outcome(run: RunRecord) -> str:
    """One line on how a run went."""
    if run.status == "ok":
        return (
            f"held-out PSNR {run.psnr:.2f} dB, start-up {run.startup_s:.1f} s, training {run.train_s:.1f} s, "
            f"{run.splats} splats"
        )
    return f"FAILED (recorded; the study goes on): {(run.error or '?').splitlines()[-1]}"


def run_study(study: StudyConfig, specs: list[RunSpec]) -> list[RunRecord]:
    """Every run's record, in the order of `specs`: reused from an earlier invocation where it finished, else
    trained now (the lanes side by side, each lane's pairs in order). Ctrl-C: no further run starts."""
    from bytesplat_ns.compare.runner import run_one

    lock = threading.Lock()
    records: dict[int, RunRecord] = {}
    todo: list[tuple[int, str]] = []  # (index in specs, why it runs again)
    for index, spec in enumerate(specs):
        record, why = reusable(spec)
        if record is None:
            todo.append((index, why))
        else:
            records[index] = record
            print(f"reused {record.label} ({record.run_dir}): {outcome(record)}", flush=True)
    started = 0

    def run(item: tuple[int, str]) -> None:
        nonlocal started
        index, why = item
        spec = specs[index]
        gpus = f" (GPU {','.join(map(str, spec.gpus))})" if spec.gpus is not None else ""
        with lock:
            started += 1
            print(
                f"[{started}/{len(todo)}] {spec.role} {spec.method}, seed {spec.seed}, {spec.steps} steps on "
                f"{spec.device}{gpus}" + (f"; again: {why}" if why else ""),
                flush=True,
            )
        records[index] = run_one(spec, timeout_s=study.run_timeout_s)
        with lock:
            print(f"    {records[index].label}: {outcome(records[index])}", flush=True)

    num_lanes = len(study.lanes or [None])
    work: list[list[tuple[int, str]]] = [[] for _ in range(num_lanes)]
    for item in todo:
        work[lane_of_pair(specs[item[0]].pair, num_lanes)].append(item)
    try:
        if num_lanes == 1:
            for item in work[0]:
                run(item)
        else:
            run_lanes(work, run)
    except KeyboardInterrupt:
        print(
            f"Interrupted: no more runs; the report covers the {len(records)} made. The same command again finishes "
            "the study (finished runs are reused)."
        )
    return [records[index] for index in sorted(records)]


def compare(argv: list[str] | None = None) -> dict:
    """Run (or resume) the study the arguments describe; returns the report (as written to report.json)."""
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
    lanes = None
    if args.devices is not None:
        try:
            lanes = study_lanes(args.devices, args.num_devices, args.device, args.seeds)
        except ValueError as error:
            p.error(str(error))
    device = resolve_device(args.device)
    from nerfstudio.configs.method_configs import all_methods

    for method in (args.baseline, args.candidate):
        if method not in all_methods:
            p.error(f"unknown method {method!r}; registered: {', '.join(sorted(all_methods))}")
    study = study_from_args(args, extra, device, lanes)
    output = Path(study.output)
    if problem := earlier_study_problem(output, study):
        p.error(problem)

    from bytesplat_ns.compare.report import write_report

    output.mkdir(parents=True, exist_ok=True)
    write_json(output / STUDY_FILE, dataclasses.asdict(study))
    specs = run_specs(study)
    runs = run_study(study, specs)
    report = write_report(study, runs, planned=len(specs))
    print(f"\n{report['verdict']}")
    for reason in report["reasons"]:
        print(f"  - {reason}")
    print(f"Report: {output / 'report.md'} (and report.json)")
    return report


def main(argv: list[str] | None = None) -> None:
    """Console entry point (exits 0 whatever the verdict; the verdict is in report.json)."""
    compare(argv)


if __name__ == "__main__":
    main()
