"""Where the host's time goes in `ns-train bytesplat`'s training loop, sampled from outside the process (issue #6).

torch.profiler slows every host op it records (under it cudaGraphLaunch took 1.9 us per graph node,
benchmarks/RESULTS.md, twenty-third session), so its host figures compare only with each other. This trains
bytesplat on lego under py-spy, a sampling profiler that reads the process's Python stacks from outside without
pausing it (--nonblocking), --rate times a second, idle samples included (a thread waiting for the GIL or the GPU
spends the loop's time too). The samples of the main thread inside nerfstudio's training loop (Trainer.train) are
the loop's time; each function's share of them, times the run's loop time per step (run_summary.py), is its host
time per step:
- a tree of inclusive time per step below the loop (functions with at least --min-share of it, --depth levels);
- the lines where the samples end (self time), the --top largest.
With --native the stacks go on below the Python frames into C/C++ (torch, the CUDA driver, the interpreter's GIL):
py-spy then pauses the process at each sample, which costs the loop more.
The same training runs --plain-runs times without py-spy first, for the sampler's cost on the loop. Writes --json
and the loop's samples beside it (<json stem>.loop_stacks.txt, collapsed stacks); table last. py-spy comes from
--py-spy (a path) or --py-spy-wheel (its wheel, unpacked into --out).

    python3 benchmarks/host_samples.py --data .device-kit/data/lego --steps 7000 \
        --py-spy-wheel .build-cache/tools/py_spy-0.4.3-py2.py3-none-manylinux1_x86_64.manylinux_2_5_x86_64.whl \
        --json $OUT/host_samples.json
"""

from __future__ import annotations

import argparse
import json
import re
import stat
import sys
import zipfile
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from lone_rank import RUNNER as LONE_RANK  # noqa: E402
from quality_seeds import RUNNER, Run, start  # noqa: E402
from run_summary import run_summary  # noqa: E402

LOOP_FRAME = re.compile(r"^(Trainer\.)?train \(.*nerfstudio/engine/trainer\.py:\d+\)$")
"""nerfstudio's Trainer.train: its samples are the training loop's."""
FRAME = re.compile(r"^(?P<function>.*) \((?P<file>.*):(?P<line>\d+)\)$")


def unpack_py_spy(wheel: Path, into: Path) -> Path:
    """The py-spy executable from its wheel (a static binary under <name>.data/scripts/)."""
    with zipfile.ZipFile(wheel) as archive:
        member = next((m for m in archive.namelist() if m.endswith("/scripts/py-spy")), None)
        if member is None:
            raise SystemExit(f"{wheel} holds no py-spy executable: pass the py-spy wheel (pip download py-spy)")
        into.mkdir(parents=True, exist_ok=True)
        binary = into / "py-spy"
        binary.write_bytes(archive.read(member))
    binary.chmod(binary.stat().st_mode | stat.S_IEXEC)
    return binary


def short(frame: str, keep_line: bool) -> str:
    """'function (/long/path/site-packages/pkg/mod.py:12)' -> 'function (pkg/mod.py[:12])'."""
    match = FRAME.match(frame)
    if match is None:
        return frame
    path = re.sub(r"^.*?(site-packages|dist-packages)/", "", match["file"])
    path = re.sub(r"^.*?/(bytesplat_ns|benchmarks)/", r"\1/", path)
    return f"{match['function']} ({path}{':' + match['line'] if keep_line else ''})"


def loop_stacks(raw: Path) -> list[tuple[list[str], int]]:
    """py-spy's raw (collapsed) samples -> [(frames from the training loop's frame down, root first; count)]."""
    stacks = []
    for line in raw.read_text(errors="replace").splitlines():
        frames, _, count = line.rpartition(" ")
        if not frames or not count.isdigit():
            continue
        parts = frames.split(";")
        at = next((i for i, f in enumerate(parts) if LOOP_FRAME.match(f)), None)
        if at is not None:
            stacks.append((parts[at:], int(count)))
    return stacks


def tree(stacks: list[tuple[list[str], int]], depth: int) -> Counter[tuple[str, ...]]:
    """Inclusive samples per call path (functions without line numbers) below the loop, to `depth` levels; the
    loop's own lines count as the path ()."""
    paths: Counter[tuple[str, ...]] = Counter()
    for frames, count in stacks:
        names = [short(f, keep_line=False) for f in frames[1 : depth + 1]]
        paths[()] += count
        for level in range(1, len(names) + 1):
            path = tuple(names[:level])
            if level == 1 or path[-1] != path[-2]:  # a recursive call counts once
                paths[path] += count
    return paths


def us_per_sample(stacks: list[tuple[list[str], int]], loop_ms: float) -> float:
    """Microseconds of loop time per step that one sample stands for."""
    return 1000 * loop_ms / sum(count for _, count in stacks)


def summarise(stacks: list[tuple[list[str], int]], loop_ms: float, depth: int, min_share: float, top: int) -> dict:
    total = sum(count for _, count in stacks)
    us = us_per_sample(stacks, loop_ms)
    paths = tree(stacks, depth)
    rows = [{"path": list(path), "us_per_step": count * us, "share": count / total}
            for path, count in paths.items() if path and count / total >= min_share]  # fmt: skip
    leaves: Counter[str] = Counter()
    for frames, count in stacks:
        leaves[short(frames[-1], keep_line=True)] += count
    self_lines = [{"line": line, "us_per_step": count * us, "share": count / total}
                  for line, count in leaves.most_common(top)]  # fmt: skip
    return {"loop_samples": total, "loop_ms_per_step": loop_ms, "tree": rows, "self_lines": self_lines}


def leaves_under(stacks: list[tuple[list[str], int]], function: str, loop_ms: float, top: int) -> list[dict]:
    """Where the samples inside `function` (a frame's function name) end, the `top` largest, as host time per step:
    with --native, the C/C++ frame each of its samples stops in."""
    leaves: Counter[str] = Counter()
    for frames, count in stacks:
        if any((match := FRAME.match(f)) and match["function"] == function for f in frames):
            leaves[short(frames[-1], keep_line=True)] += count
    us = us_per_sample(stacks, loop_ms)
    return [{"leaf": leaf, "us_per_step": count * us} for leaf, count in leaves.most_common(top)]


def print_tree(rows: list[dict]) -> None:
    """Depth-first, each level's children by time."""
    children: dict[tuple, list[dict]] = {}
    for row in rows:
        children.setdefault(tuple(row["path"][:-1]), []).append(row)

    def walk(parent: tuple) -> None:
        for row in sorted(children.get(parent, []), key=lambda r: -r["us_per_step"]):
            indent = "  " * (len(row["path"]) - 1)
            print(f"{row['us_per_step']:8.1f} us {100 * row['share']:5.1f}%  {indent}{row['path'][-1]}")
            walk(tuple(row["path"]))

    walk(())


def train(args: argparse.Namespace, name: str, wrapper: list[str]) -> Run:
    """Train bytesplat on args.data for args.steps views (args.seed, args.options; with args.lone_rank as rank 0 of
    two, lone_rank.py), started through `wrapper`; fails unless ns-train exits cleanly. Also gpu_pace.py's."""
    run = Run(name, args.seed, "bytesplat", [0], ["--summary-eval", "False", *args.options], args.out / f"{name}.log")
    runner = LONE_RANK if args.lone_rank else RUNNER
    start(run, args.steps, args.data, args.out, wrapper=wrapper, runner=runner)
    if run.process.wait() != 0:
        raise SystemExit(f"{name}: ns-train failed (exit {run.process.returncode}); see {run.log}")
    return run


def training_arguments(description: str, out: str) -> argparse.ArgumentParser:
    """The options of a script that trains bytesplat on lego through `train` (this one's, gpu_pace.py's,
    first_launch.py's); `out`: the default --out folder."""
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, required=True, help="lego (blender-data)")
    parser.add_argument("--steps", type=int, default=7000, help="views (steps with one GPU)")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--lone-rank", action="store_true", help="train as rank 0 of two on one GPU (lone_rank.py)")
    parser.add_argument("--out", type=Path, default=Path(out))
    parser.add_argument("--json", type=Path, required=True)
    return parser


def main() -> None:
    parser = training_arguments(__doc__, "/tmp/host-samples")
    parser.add_argument("--rate", type=int, default=1000, help="samples per second")
    parser.add_argument("--plain-runs", type=int, default=1, help="runs without py-spy first, for its cost")
    parser.add_argument("--depth", type=int, default=6, help="levels of the tree below the loop")
    parser.add_argument("--min-share", type=float, default=0.01, help="smallest share of the loop shown")
    parser.add_argument("--top", type=int, default=25, help="self-time lines shown")
    parser.add_argument(
        "--native",
        action="store_true",
        help="C/C++ frames below the Python ones, where a call's time goes (py-spy --native: it pauses "
        "the process at each sample; keep --rate low)",
    )
    parser.add_argument("--under", nargs="*", default=[], help="functions whose samples' last frames are listed too")
    parser.add_argument("--py-spy", type=Path, help="the py-spy executable")
    parser.add_argument("--py-spy-wheel", type=Path, help="or its wheel")
    parser.add_argument("--options", nargs=argparse.REMAINDER, default=[], help="more ns-train options (last)")
    args = parser.parse_args()
    if args.py_spy is None and args.py_spy_wheel is None:
        raise SystemExit("Give --py-spy PATH or --py-spy-wheel WHEEL (pip download py-spy --no-deps).")
    py_spy = args.py_spy or unpack_py_spy(args.py_spy_wheel, args.out / "py-spy-bin")
    plain = [run_summary(train(args, f"plain{i}", []).folder)["loop_ms_per_step"] for i in range(args.plain_runs)]
    raw = args.out / "samples.txt"  # py-spy's collapsed stacks of every thread, start-up included
    how = ["--native"] if args.native else ["--nonblocking"]  # native stacks need the process paused per sample
    wrapper = [str(py_spy), "record", *how, "--idle", "--threads", "--full-filenames", "--format", "raw",
               "--rate", str(args.rate), "--output", str(raw), "--"]  # fmt: skip
    sampled = run_summary(train(args, "sampled", wrapper).folder)["loop_ms_per_step"]
    stacks = loop_stacks(raw)
    if not stacks:
        raise SystemExit(f"No sample inside nerfstudio's training loop in {raw}: did py-spy attach? See the log.")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    kept = [";".join(short(f, keep_line=True) for f in frames) + f" {count}" for frames, count in stacks]
    args.json.with_suffix(".loop_stacks.txt").write_text("\n".join(kept) + "\n")
    report = {
        "steps": args.steps, "seed": args.seed, "rate": args.rate, "native": args.native, "options": args.options,
        "loop_ms_per_step_plain": plain, "loop_ms_per_step_sampled": sampled,
        **summarise(stacks, sampled, args.depth, args.min_share, args.top),
    }  # fmt: skip
    report["under"] = {name: leaves_under(stacks, name, sampled, args.top) for name in args.under}
    args.json.write_text(json.dumps(report, indent=1) + "\n")
    for name, rows in report["under"].items():
        print(f"where the samples inside {name} end:")
        for row in rows:
            print(f"{row['us_per_step']:8.1f} us  {row['leaf'][:160]}")
    print(f"lines where the loop's samples end (top {args.top}):")
    for row in report["self_lines"]:
        print(f"{row['us_per_step']:8.1f} us {100 * row['share']:5.1f}%  {row['line']}")
    print(f"\nthe loop per step, inclusive (>= {100 * args.min_share:.0f}% of it, {args.depth} levels):")
    print_tree(report["tree"])
    plain_text = ", ".join(f"{ms:.3f}" for ms in plain)
    print(f"\nloop ms/step: {plain_text} without py-spy, {sampled:.3f} sampled at {args.rate}/s; "
          f"{report['loop_samples']:,} loop samples")  # fmt: skip


if __name__ == "__main__":
    main()
