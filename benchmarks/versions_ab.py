"""Step time of earlier commits against this checkout, on one GPU in one call (issue #6).

Host speed differs between lent machines by 10-35% (benchmarks/RESULTS.md), so a change to the step is timed
against the commit before it on the same machine, in the same call. Each version trains step_time.py's
`bytesplat` lane on lego (one run at a time, on GPU 0) with its own bytesplat_ns first on PYTHONPATH; the rounds
alternate the order (A B C, C B A, ...) so a drift of the machine over the call falls on every version alike.
"." is this checkout; any other version is a commit packed beforehand on the CPU machine (the lent machine has
no git history):

    git archive --format=tar.gz -o .build-cache/versions/<commit>.tar.gz <commit>

and on the GPU machine (after device_build.sh; each version's CUDA extension is built, or loaded from
$BYTESPLAT_EXT_DIR, before the timed runs):

    python3 benchmarks/versions_ab.py --data .device-kit/data/lego --versions 3e80f56 b183322 . --rounds 2 \
        --json $OUT/versions_ab.json

Per run: the loop's wall time per step (run_summary.py), nerfstudio's "Train Iter" median over the second half,
views/s and phase times from bytesplat_stats.json, and a torch.profiler window (host and GPU ms per step). Writes
--json; table last (per version: the mean over rounds and each round's figure).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tarfile
from pathlib import Path
from unittest import mock

sys.path.insert(0, str(Path(__file__).parent))
from step_time import LANES, run_lane  # noqa: E402

HERE = Path(__file__).resolve().parent.parent


def unpack(version: str, packs: Path, into: Path) -> Path:
    """The source tree of `version` ("." is this checkout)."""
    if version == ".":
        return HERE
    pack = packs / f"{version}.tar.gz"
    if not pack.is_file():
        raise SystemExit(f"{pack} is missing: on the CPU machine run git archive --format=tar.gz -o {pack} {version}")
    root = into / version
    if not root.is_dir():
        with tarfile.open(pack) as tar:
            tar.extractall(root, filter="data")
        (root / "bytesplat_method_configs").symlink_to("method_configs")  # the name pyproject.toml installs it as
    return root


def environment(root: Path) -> dict[str, str]:
    """Python's search path with `root` first (its bytesplat_ns and bytesplat_method_configs)."""
    rest = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and Path(p).resolve() != HERE]
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), *rest])}


def build_extension(root: Path) -> str:
    """Build (or load) `root`'s CUDA extension now, outside the timed runs; -> its module name."""
    code = (
        "import bytesplat_ns; from bytesplat_ns.cuda import build; build.load(); print(bytesplat_ns.__file__, "
        "build.module_name())"
    )
    # in root: python -c puts its working folder first on the path (ns-train does not)
    done = subprocess.run([sys.executable, "-c", code], env=environment(root), cwd=root, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"building {root}'s extension failed:\n{done.stderr[-3000:]}")
    where, module = done.stdout.split()[-2:]
    if not Path(where).resolve().is_relative_to(root.resolve()):
        raise SystemExit(
            f"bytesplat_ns came from {where}, not {root}: an editable install of the project shadows "
            "PYTHONPATH; run this where the project is installed as on the GPU machine (on-device.sh)"
        )
    return module


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, required=True, help="lego (blender-data)")
    parser.add_argument("--versions", nargs="+", default=["."], help='commits packed in --packs, "." this checkout')
    parser.add_argument("--packs", type=Path, default=HERE / ".build-cache" / "versions")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--steps", type=int, default=7000)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--profile-steps", type=int, default=20)
    parser.add_argument("--profile-start", type=int, default=6510)
    parser.add_argument("--out", type=Path, default=Path("/tmp/versions-ab"))
    parser.add_argument("--json", type=Path, default=Path("versions_ab.json"))
    args = parser.parse_args()

    import torch

    roots = {v: unpack(v, args.packs, args.out / "src") for v in args.versions}
    modules = {v: build_extension(root) for v, root in roots.items()}
    runs: dict[str, list[dict]] = {v: [] for v in args.versions}
    for round_ in range(args.rounds):
        for version in args.versions if round_ % 2 == 0 else reversed(args.versions):
            lane = argparse.Namespace(**{**vars(args), "wide": False, "out": args.out / f"{version}-{round_}"})
            with mock.patch.dict(os.environ, environment(roots[version])):  # ns-train and ns-eval inherit it
                result = run_lane("bytesplat", LANES["bytesplat"], lane)
            runs[version].append({"round": round_, **result})
    report = {"gpu": torch.cuda.get_device_name(0), "scene": "lego", "steps": args.steps, "seed": args.seed,
              "extensions": modules, "runs": runs}  # fmt: skip
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=2) + "\n")

    def mean(values: list) -> float | None:
        values = [v for v in values if v is not None]
        return statistics.mean(values) if values else None

    fmt = lambda v, f: format(v, f) if v is not None else "-"  # noqa: E731
    print(f"\n{'version':<10} {'loop ms':>7} {'2nd half':>8} {'views/s':>8} {'host ms':>7} {'gpu ms':>6} {'PSNR':>6} "
          f"{'splats':>7}  loop ms per round")  # fmt: skip
    for version, results in runs.items():
        pick = lambda key, results=results: [r.get(key) for r in results]  # noqa: E731
        stats = [r.get("bytesplat_stats") or {} for r in results]
        profile = [r.get("step_profile") or {} for r in results]
        print(f"{version:<10} {fmt(mean(pick('loop_ms_per_step')), '7.3f')} "
              f"{fmt(mean(pick('step_ms_median_second_half')), '8.3f')} "
              f"{fmt(mean([s.get('views_per_second') for s in stats]), '8.0f')} "
              f"{fmt(mean([p.get('host_ms') for p in profile]), '7.3f')} "
              f"{fmt(mean([p.get('gpu_kernel_ms') for p in profile]), '6.3f')} {fmt(mean(pick('psnr')), '6.2f')} "
              f"{fmt(mean(pick('splats')), '7.0f')}  "
              + " ".join(fmt(v, ".3f") for v in pick("loop_ms_per_step")))  # fmt: skip


if __name__ == "__main__":
    main()
