"""A short CPU training on a small built-in scene, then ns-eval, ns-render dataset, ns-export and a resume."""

from __future__ import annotations

import json
import math
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
    proc = ns("ns-train", *train_args(scene, root / "out", "first", STEPS))
    run_dir = root / "out" / "e2e" / "bytesplat" / "first"
    (run_dir / "train.log").write_text(proc.stdout)
    return run_dir


def checkpoint(run_dir: Path, step: int) -> dict:
    return torch.load(run_dir / "nerfstudio_models" / f"step-{step:09d}.ckpt", map_location="cpu")


def test_loss_falls(run):
    events = EventAccumulator(str(run)).Reload()
    losses = [e.value for e in events.Scalars("Train Loss")]
    assert len(losses) >= 10
    first, last = sum(losses[:3]) / 3, sum(losses[-3:]) / 3
    assert last < 0.6 * first, losses


def test_progress_shows_heldout_psnr_and_a_summary(run):
    log = (run / "train.log").read_text()
    assert "ETA" in log and "Test PSNR" in log
    summary = log[log.index("bytesplat summary") :]
    for line in ("Training time", "Splats", "Held-out PSNR", "Checkpoints", "config.yml"):
        assert line in summary, summary


def test_stats_stamp_every_checkpoint_with_its_save_time(run):
    """time_to_target.py reads these stamps; the final checkpoint (nerfstudio's, after the loop) has one too."""
    stats = json.loads((run / "bytesplat_stats.json").read_text())
    saved = {int(step) for step in stats["saved_unix"]}
    written = {int(p.stem.split("-")[1]) for p in (run / "nerfstudio_models").glob("step-*.ckpt")}
    assert STEPS - 1 in saved and written <= saved, (saved, written)


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

    # the exported PLY initialises a new training: same splats before the first refine
    scene = run.parents[2].parent / "scene"
    args = train_args(scene, run.parents[2], "from-ply", 20)
    ns("ns-train", *args, "--pipeline.model.init-splats", str(run / "export" / "splat.ply"))
    restarted = torch.load(
        run.parents[0] / "from-ply" / "nerfstudio_models" / f"step-{19:09d}.ckpt", map_location="cpu"
    )
    assert restarted["pipeline"]["_model.gauss_params.means"].shape[0] == vertices.count


HIDE_FFMPEG = (
    "import shutil, sys; which = shutil.which; "
    "shutil.which = lambda cmd, *a, **k: None if cmd == 'ffmpeg' else which(cmd, *a, **k); "
    "from nerfstudio.scripts.render import entrypoint; sys.argv[0] = 'ns-render'; entrypoint()"
)


def camera_path_file(run: Path) -> Path:
    """Three held-out cameras as a viewer-style camera path (poses in the trained scene's frame)."""
    from bytesplat_ns.dataparser import ByteSplatDataParserConfig

    cameras = (
        ByteSplatDataParserConfig(data=run.parents[2].parent / "scene").setup().get_dataparser_outputs("test").cameras
    )
    height, width, fy = int(cameras.height[0]), int(cameras.width[0]), float(cameras.fy[0])
    fov = math.degrees(2 * math.atan(height / (2 * fy)))
    poses = [
        torch.cat([c2w, torch.tensor([[0.0, 0.0, 0.0, 1.0]])]).flatten().tolist()
        for c2w in cameras.camera_to_worlds[:3]
    ]
    keyframes = [{"camera_to_world": pose, "fov": fov, "aspect": width / height} for pose in poses]
    path = {"camera_type": "perspective", "render_height": height, "render_width": width, "seconds": 1.0}
    path["camera_path"] = keyframes
    out = run / "camera_path.json"
    out.write_text(json.dumps(path))
    return out


@pytest.mark.parametrize("mode,ffmpeg", [("interpolate", True), ("interpolate", False), ("camera-path", True)])
def test_ns_render_video_or_frames(run, mode, ffmpeg):
    import shutil
    import subprocess
    import sys

    if ffmpeg and shutil.which("ffmpeg") is None:
        pytest.fail("ffmpeg is missing: `make test` installs it (Debian package ffmpeg)")
    target = run / f"{mode}-{ffmpeg}.mp4"
    args = [mode, "--load-config", str(run / "config.yml"), "--output-path", str(target)]
    if mode == "interpolate":
        args += ["--interpolation-steps", "2", "--frame-rate", "4"]
    else:
        args += ["--camera-path-filename", str(camera_path_file(run))]
    if ffmpeg:
        ns("ns-render", *args)
        assert target.stat().st_size > 0
    else:
        proc = subprocess.run([sys.executable, "-c", HIDE_FFMPEG, *args], capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert "ffmpeg not found: writing frames" in proc.stdout
        assert not target.exists() and len(list(target.with_suffix("").glob("*"))) >= 2


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
    assert "_model._extra_state" in after["pipeline"]  # densification statistics travel with the checkpoint
    assert not torch.equal(moved, start), "the resumed run's optimizer did not update the loaded splats"
