"""Time `ns-export gaussian-splat`'s PLY writing: nerfstudio 1.1.5's per-vertex loop against bytesplat's
vectorised writer, on N random splats laid out as the exporter lays out an SH-degree-3 model (62 float
properties), and check that both files are byte-identical.

Usage: python benchmarks/ply_export.py [--count N] [--json PATH] [--repeats R]
"""

from __future__ import annotations

import argparse
import filecmp
import json
import os
import platform
import tempfile
import time
from collections import OrderedDict
from pathlib import Path

import numpy as np

# bytesplat_ns before nerfstudio's exporter: with the exporter imported first, bytesplat's import-time patch
# runs while the exporter is still half-initialised.
from bytesplat_ns import splat_ply

DEFAULT_COUNT = 1_000_000
DEFAULT_REPEATS = 3
DEFAULT_JSON = Path(__file__).resolve().parent / "results" / "ply_export.json"
SH_DEGREE = 3
NUM_SH_REST = (SH_DEGREE + 1) ** 2 - 1  # per colour channel
NUM_PROPERTIES = 3 + 3 + 3 + 3 * NUM_SH_REST + 1 + 3 + 4  # xyz, normals, f_dc, f_rest, opacity, scales, quats
SEED = 0


def splat_map(count: int, seed: int = SEED) -> OrderedDict[str, np.ndarray]:
    """Random float32 splat parameters, arranged as ExportGaussianSplat.main arranges a model's (sh_coeffs mode)."""
    rng = np.random.default_rng(seed)
    normal = lambda *shape: rng.standard_normal(shape, dtype=np.float32)
    positions = normal(count, 3)
    out: OrderedDict[str, np.ndarray] = OrderedDict()
    out["x"], out["y"], out["z"] = positions[:, 0], positions[:, 1], positions[:, 2]
    for name in ("nx", "ny", "nz"):
        out[name] = np.zeros(count, dtype=np.float32)
    shs_0 = normal(count, 3)
    for i in range(3):
        out[f"f_dc_{i}"] = shs_0[:, i, None]
    shs_rest = normal(count, NUM_SH_REST, 3).transpose(0, 2, 1).copy().reshape(count, -1)  # the exporter's order
    for i in range(shs_rest.shape[-1]):
        out[f"f_rest_{i}"] = shs_rest[:, i, None]
    out["opacity"] = normal(count, 1)
    scales = normal(count, 3) - 3
    for i in range(3):
        out[f"scale_{i}"] = scales[:, i, None]
    quats = normal(count, 4)
    for i in range(4):
        out[f"rot_{i}"] = quats[:, i, None]
    assert len(out) == NUM_PROPERTIES
    return out


def nerfstudio_writer():
    """nerfstudio's own ExportGaussianSplat.write_ply, whether or not bytesplat's patch is installed."""
    from nerfstudio.scripts import exporter

    cls = exporter.ExportGaussianSplat
    writer = getattr(cls, "nerfstudio_write_ply", cls.write_ply)
    if writer.__module__ != exporter.__name__:
        raise RuntimeError(f"expected nerfstudio's writer, found {writer.__module__}.{writer.__qualname__}")
    return writer


def seconds(writer, path: Path, count: int, tensors: OrderedDict[str, np.ndarray]) -> float:
    start = time.perf_counter()
    writer(str(path), count, tensors)
    return time.perf_counter() - start


def machine() -> str:
    return f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=DEFAULT_COUNT, help="number of splats")
    parser.add_argument("--json", type=Path, default=DEFAULT_JSON, help="where to write the results")
    parser.add_argument(
        "--repeats", type=int, default=DEFAULT_REPEATS, help="bytesplat's writer: best of this many runs"
    )
    args = parser.parse_args()

    original = nerfstudio_writer()
    tensors = splat_map(args.count)
    with tempfile.TemporaryDirectory(prefix="ply_export_") as tmp:
        theirs, ours = Path(tmp) / "nerfstudio.ply", Path(tmp) / "bytesplat.ply"
        print(f"nerfstudio's per-vertex writer, {args.count:,} splats x {NUM_PROPERTIES} properties ...", flush=True)
        seconds_nerfstudio = seconds(original, theirs, args.count, tensors)
        seconds_bytesplat = min(seconds(splat_ply.write_ply, ours, args.count, tensors) for _ in range(args.repeats))
        identical = filecmp.cmp(theirs, ours, shallow=False)
        size = ours.stat().st_size

    result = {
        "count": args.count,
        "seconds_nerfstudio": round(seconds_nerfstudio, 3),
        "seconds_bytesplat": round(seconds_bytesplat, 4),
        "speedup": round(seconds_nerfstudio / seconds_bytesplat, 1),
        "identical": identical,
        "machine": machine(),
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=2) + "\n")

    print(f"file: {size / 2**20:.1f} MiB; bytesplat best of {args.repeats}; results in {args.json}")
    rows = [
        ("count", f"{result['count']:,}"),
        ("nerfstudio write_ply (s)", f"{result['seconds_nerfstudio']:.3f}"),
        ("bytesplat write_ply (s)", f"{result['seconds_bytesplat']:.4f}"),
        ("speed-up", f"{result['speedup']:.1f}x"),
        ("identical", "yes" if identical else "no"),
        ("machine", result["machine"]),
    ]
    width = max(len(name) for name, _ in rows)
    print("\n".join(f"{name:<{width}}  {value}" for name, value in rows))


if __name__ == "__main__":
    main()
