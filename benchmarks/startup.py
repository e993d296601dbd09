"""Where `ns-train bytesplat`'s start-up goes (issue #6: launch to the first step), on the machine it runs on.

Three probes, each in a fresh process:
1. imports: `python -X importtime` of nerfstudio's ns-train module; the slowest packages (cumulative seconds).
2. CUDA pieces, timed one after another: torch import, CUDA context, bytesplat's extension load (built
   already), gsplat's CUDA module load.
3. a short training run (--steps steps, white background, no viewer) under cProfile: the functions that take
   the most cumulative time before the first step (the run's own start-up marks, RunStats.startup_unix, split
   the launch-to-first-step time; the profile says what runs inside each part). Profiling slows Python code,
   so the probe's seconds are above an unprofiled run's; the marks of an unprofiled run are in step_time.py.
Writes --json, table last.

    python3 benchmarks/startup.py --data .device-kit/data/lego --json $OUT/startup.json --prof $OUT/startup.prof
"""

from __future__ import annotations

import argparse
import json
import os
import pstats
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from step_time import startup_phases  # noqa: E402

OFFLINE = str(Path(__file__).parent / "offline_nerfstudio.py")

CUDA_PIECES = """
import json, time
t = [time.time()]
import torch; t.append(time.time())
torch.zeros(1, device="cuda"); torch.cuda.synchronize(); t.append(time.time())
from bytesplat_ns.cuda import build; build.load(); t.append(time.time())
from gsplat.cuda._backend import _C; t.append(time.time())
names = ["torch import", "CUDA context", "bytesplat extension load", "gsplat CUDA module load"]
print(json.dumps({n: b - a for n, a, b in zip(names, t, t[1:])}))
"""


def import_times(top: int) -> dict[str, float]:
    """-> the `top` slowest imports (cumulative seconds) of nerfstudio's ns-train module, and the total."""
    code = "from nerfstudio.scripts.train import entrypoint"
    started = time.time()
    done = subprocess.run([sys.executable, "-X", "importtime", "-c", code], capture_output=True, text=True)
    total = time.time() - started
    rows = []
    for line in done.stderr.splitlines():
        parts = line.split("|")
        if len(parts) == 3 and parts[1].strip().isdigit():
            rows.append((int(parts[1]) / 1e6, parts[2].rstrip()))
    rows.sort(reverse=True)
    return {"process (s)": total, **{name: seconds for seconds, name in rows[:top]}}


def profiled_run(args: argparse.Namespace) -> dict:
    out = args.out
    cmd = [
        sys.executable, "-m", "cProfile", "-o", str(args.prof), OFFLINE, "ns-train", "bytesplat", "--data",
        str(args.data), "--max-num-iterations", str(args.steps), "--vis", "tensorboard", "--steps-per-eval-image", "0",
        "--steps-per-eval-all-images", "0", "--steps-per-save", str(args.steps), "--summary-eval", "False",
        "--output-dir", str(out), "--experiment-name", "startup", "--timestamp", "probe",
        "--pipeline.model.background-color", "white", "blender-data",
    ]  # fmt: skip
    launched = time.time()
    with open(out / "startup_probe.log", "w") as log:
        env = {**os.environ, "TORCHDYNAMO_DISABLE": "1"}
        subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, check=True, env=env)
    stats = json.loads((out / "startup" / "bytesplat" / "probe" / "bytesplat_stats.json").read_text())
    phases = startup_phases(launched, stats)
    profile = pstats.Stats(str(args.prof))
    rows = []
    for (file, line, name), (_, _, _, cumulative, _) in profile.stats.items():  # type: ignore[attr-defined]
        if cumulative >= args.min_seconds:
            rows.append((cumulative, f"{Path(file).parent.name}/{Path(file).name}:{line}({name})"))
    rows.sort(reverse=True)
    return {"phases (s, profiled)": phases, "functions (cumulative s, profiled)": dict((n, s) for s, n in rows)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, required=True, help="lego (blender-data)")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--top", type=int, default=25, help="slowest imports to list")
    parser.add_argument("--min-seconds", type=float, default=0.3, help="profiled functions listed from this long")
    parser.add_argument("--out", type=Path, default=Path("/tmp/startup"))
    parser.add_argument("--prof", type=Path, default=Path("/tmp/startup/startup.prof"))
    parser.add_argument("--json", type=Path, default=Path("startup.json"))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    args.prof.parent.mkdir(parents=True, exist_ok=True)

    import torch

    pieces = subprocess.run([sys.executable, "-c", CUDA_PIECES], capture_output=True, text=True)
    if pieces.returncode != 0:
        print(pieces.stderr[-2000:])
    report = {
        "gpu": torch.cuda.get_device_name(0),
        "imports (cumulative s)": import_times(args.top),
        "cuda pieces (s)": json.loads(pieces.stdout.strip().splitlines()[-1]) if pieces.returncode == 0 else {},
        **profiled_run(args),
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=2) + "\n")
    for section in ("functions (cumulative s, profiled)", "imports (cumulative s)", "cuda pieces (s)",
                    "phases (s, profiled)"):  # fmt: skip
        print(f"\n{section}")
        for name, seconds in list(report[section].items())[:40]:
            print(f"  {seconds:7.2f}  {name}")


if __name__ == "__main__":
    main()
