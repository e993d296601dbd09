"""A short CPU training on a small built-in scene, then ns-eval, ns-render dataset, ns-export and a resume."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from bytesplat_ns.demo_scene import DemoSceneConfig, generate_demo_scene
from tests.nerfstudio_cli import ns

STEPS = 300
RESUME_STEPS = 60
"""nerfstudio runs --max-num-iterations more steps after the loaded one."""
MIN_HELDOUT_PSNR = 24.0
SCENE = DemoSceneConfig(width=64, height=48, num_train=16, num_eval=4, num_points=1500, seed=3)


def train_args(scene: Path, out: Path, timestamp: str, steps: int) -> list[str]:
    return [
        "bytesplat", "--data", str(scene), "--machine.device-type", "cpu",
        "--max-num-iterations", str(steps), "--output-dir", str(out), "--experiment-name", "e2e",
        "--timestamp", timestamp, "--vis", "tensorboard", "--steps-per-save", "100",
        "--steps-per-eval-all-images", "0", "--logging.steps-per-log", "10",
        "--pipeline.model.num-downscales", "0", "--pipeline.model.warmup-length", "100",
        "--pipeline.model.refine-every", "50", "--pipeline.model.sh-degree-interval", "100",
        "--pipeline.model.stop-split-at", str(STEPS),  # the resumed steps keep the splat count fixed
    ]  # fmt: skip


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("e2e")
    scene = generate_demo_scene(root / "scene", SCENE)
    ns("ns-train", *train_args(scene, root / "out", "first", STEPS))
    return root / "out" / "e2e" / "bytesplat" / "first"


def checkpoint(run_dir: Path, step: int) -> dict:
    return torch.load(run_dir / "nerfstudio_models" / f"step-{step:09d}.ckpt", map_location="cpu")


def test_loss_falls(run):
    events = EventAccumulator(str(run)).Reload()
    losses = [e.value for e in events.Scalars("Train Loss")]
    assert len(losses) >= 10
    first, last = sum(losses[:3]) / 3, sum(losses[-3:]) / 3
    assert last < 0.6 * first, losses


def test_densification_ran(run):
    means = checkpoint(run, STEPS - 1)["pipeline"]["_model.gauss_params.means"]
    assert means.shape[0] != SCENE.num_points


def test_ns_eval_heldout_psnr(run):
    ns("ns-eval", "--load-config", str(run / "config.yml"), "--output-path", str(run / "eval.json"))
    results = json.loads((run / "eval.json").read_text())["results"]
    assert results["psnr"] >= MIN_HELDOUT_PSNR, results


def test_ns_render_dataset(run):
    out = run / "renders"
    ns("ns-render", "dataset", "--load-config", str(run / "config.yml"), "--output-path", str(out),
       "--split", "test", "--rendered-output-names", "rgb")  # fmt: skip
    frames = sorted(out.rglob("*.jpg")) + sorted(out.rglob("*.png"))
    assert len(frames) == SCENE.num_eval


def test_ns_export_gaussian_splat(run):
    from plyfile import PlyData

    ns("ns-export", "gaussian-splat", "--load-config", str(run / "config.yml"), "--output-dir", str(run / "export"))
    vertices = PlyData.read(str(run / "export" / "splat.ply"))["vertex"]
    count = checkpoint(run, STEPS - 1)["pipeline"]["_model.gauss_params.means"].shape[0]
    assert 0 < vertices.count <= count  # the exporter drops non-finite splats only
    assert {"x", "f_dc_0", "opacity", "scale_0", "rot_0"} <= set(vertices.data.dtype.names)


def test_resume_continues_step_count_and_training(run):
    scene = run.parents[2].parent / "scene"
    out = run.parents[2]
    args = train_args(scene, out, "resumed", RESUME_STEPS) + ["--load-dir", str(run / "nerfstudio_models")]
    ns("ns-train", *args)
    resumed = out / "e2e" / "bytesplat" / "resumed" / "nerfstudio_models"
    assert not (resumed / f"step-{0:09d}.ckpt").exists()
    before = checkpoint(run, STEPS - 1)
    last = STEPS + RESUME_STEPS - 1
    after = torch.load(resumed / f"step-{last:09d}.ckpt", map_location="cpu")
    assert after["step"] == last
    moved = after["pipeline"]["_model.gauss_params.means"]
    start = before["pipeline"]["_model.gauss_params.means"]
    assert moved.shape == start.shape
    assert not torch.equal(moved, start), "the resumed run's optimizer did not update the loaded splats"
