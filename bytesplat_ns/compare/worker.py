"""One training run of a study, in its own process: `python -m bytesplat_ns.compare.worker <spec.json>`.

The method's TrainerConfig is built as ns-train builds it (nerfstudio's own parser over all registered
methods, then the same seeding), with only the study's settings overridden: data, steps, seed, device,
output folder, and no viewer or periodic nerfstudio evaluation. Held-out PSNR is evaluated every
`eval_every` steps and after the last; that time is measured and taken out of the training time. At the
end every held-out view is rendered (PNG) and scored, and `record.json` is written in the run folder.

With --num-devices N > 1 the worker starts one process per GPU over NCCL, as ns-train does (on the CPU: N
processes over gloo); rank 0 keeps the clock, evaluates and writes the record (bytesplat counts --steps in
views: N views per step).
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from bytesplat_ns.compare.records import CurvePoint, RunRecord, RunSpec, ViewMetrics, write_json
from bytesplat_ns.lpips import stand_in_lpips_unless_on_disk

EvalFn = Callable[[], list[ViewMetrics]]


def build_config(spec: RunSpec):
    """The method's TrainerConfig, parsed by nerfstudio's ns-train parser, then the study's overrides."""
    import tyro
    from nerfstudio.configs.method_configs import AnnotatedBaseConfigUnion, all_methods

    if spec.method not in all_methods:
        raise SystemExit(f"Unknown method {spec.method!r}; registered: {', '.join(sorted(all_methods))}.")
    # parsed as one process: ns-train's own check refuses several CPU processes (its launcher needs CUDA for
    # them); the worker starts its processes itself, so on the CPU they run over gloo
    machine = ["--machine.device-type", spec.device, "--machine.num-devices", "1"]
    config = tyro.cli(AnnotatedBaseConfigUnion, args=[spec.method, *machine, *spec.extra_args])
    config.data = Path(spec.data)
    config.pipeline.datamanager.data = config.data  # what ns-train does with --data
    config.max_num_iterations = spec.steps
    config.machine.seed = spec.seed
    config.machine.device_type = spec.device
    config.machine.num_devices = spec.num_devices
    config.output_dir, config.experiment_name, config.timestamp = Path(spec.run_dir), "nerfstudio", "run"
    config.vis = "tensorboard"  # no viewer; nerfstudio's own periodic evaluations are switched off below
    config.steps_per_eval_image = config.steps_per_eval_batch = config.steps_per_eval_all_images = 0
    config.viewer.quit_on_train_completion = True
    if hasattr(config, "summary_eval"):
        config.summary_eval = False  # bytesplat's closing evaluation; the worker evaluates every view itself
    return config


def _to_png(image: torch.Tensor, path: Path) -> None:
    """image: [H, W, 3] float in [0, 1]. Written under another name, then renamed: runs on other lanes may write
    the same ground truth at the same time, and a reader never sees half a file."""
    array = (image.detach().clamp(0.0, 1.0) * 255.0).round().to(torch.uint8).cpu().numpy()
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.stem}.{os.getpid()}.png")
    Image.fromarray(np.ascontiguousarray(array[..., :3])).save(partial)
    partial.replace(path)


def _relative_name(path: Path, data: Path) -> str:
    try:
        return str(Path(path).resolve().relative_to(data.resolve()))
    except ValueError:
        return Path(path).name


@torch.no_grad()
def evaluate(pipeline, names: list[str], save: RunSpec | None = None) -> list[ViewMetrics]:
    """Score every held-out view (eval mode); with `save`, write each render (and the ground truth once) as PNG."""
    model = pipeline.model
    pipeline.eval()
    views = []
    try:
        for index, (camera, batch) in enumerate(pipeline.datamanager.fixed_indices_eval_dataloader):
            outputs = model.get_outputs_for_camera(camera)
            metrics, _ = model.get_image_metrics_and_images(outputs, batch)
            lpips = metrics.get("lpips")
            lpips = None if lpips is None or not np.isfinite(lpips) else float(lpips)
            file = f"{index:03d}-{Path(names[index]).stem}.png"
            render = Path(save.run_dir if save else "") / "renders" / file
            gt = Path(save.gt_dir if save else "") / file
            if save is not None:
                _to_png(outputs["rgb"], render)
                if not gt.exists():
                    truth = model.get_gt_img(batch["image"])
                    if "background" in outputs:
                        truth = model.composite_with_background(truth, outputs["background"])
                    _to_png(truth, gt)
            root = Path(save.output_dir) if save else Path("")
            views.append(
                ViewMetrics(
                    name=names[index],
                    psnr=float(metrics["psnr"]),
                    ssim=float(metrics["ssim"]),
                    lpips=lpips,
                    render=str(render.relative_to(root)) if save else "",
                    gt=str(gt.relative_to(root)) if save else "",
                )
            )
    finally:
        pipeline.train()
    return views


class TrainingClock:
    """Training callbacks: start the clock at the first step; evaluate held-out PSNR every `eval_every` steps and
    after the last, keeping that evaluation time out of the training time."""

    def __init__(self, spec: RunSpec, start_step: int, total_steps: int, evaluate_all: EvalFn, evaluate_final: EvalFn
                 ) -> None:  # fmt: skip
        self.spec, self.start_step, self.total_steps = spec, start_step, total_steps
        self.eval_every = max(1, round(spec.eval_every * total_steps / spec.steps))  # in steps of this run
        self.evaluate_all, self.evaluate_final = evaluate_all, evaluate_final
        self.cuda = spec.device.startswith("cuda")
        self.t0: float | None = None  # perf_counter() at the start of the first step
        self.first_step_at: float | None = None  # time.time() at the start of the first step
        self.eval_s = 0.0
        self.steps_done = 0
        self.peak_mem: int | None = None  # peak GPU memory of the training steps [bytes], evaluations excluded
        self.curve: list[CurvePoint] = []
        self.final_views: list[ViewMetrics] | None = None

    def _sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()

    def before_step(self, step: int) -> None:
        if self.t0 is None:
            self._sync()
            self.first_step_at, self.t0 = time.time(), time.perf_counter()

    def after_step(self, step: int) -> None:
        self.steps_done = step + 1 - self.start_step
        last = self.steps_done >= self.total_steps
        if self.steps_done % self.eval_every and not last:
            return
        self._sync()
        started = time.perf_counter()
        assert self.t0 is not None
        if self.cuda:
            self.peak_mem = max(self.peak_mem or 0, torch.cuda.max_memory_allocated())
        train_s = started - self.t0 - self.eval_s
        views = self.evaluate_final() if last else self.evaluate_all()
        if last:
            self.final_views = views
        psnr = float(np.mean([v.psnr for v in views])) if views else float("nan")
        self.curve.append(CurvePoint(step=self.steps_done, train_s=train_s, psnr=psnr))
        if self.cuda:
            torch.cuda.reset_peak_memory_stats()  # the next reading starts from what training holds now
        self.eval_s += time.perf_counter() - started

    @property
    def train_s(self) -> float | None:
        return self.curve[-1].train_s if self.curve else None


def _set_random_seed(seed: int) -> None:
    """As ns-train's train_loop does before building the trainer."""
    import random

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def run(spec: RunSpec) -> RunRecord:
    record = RunRecord(method=spec.method, role=spec.role, seed=spec.seed, pair=spec.pair, device=spec.device)
    output = Path(spec.output_dir)
    record.run_dir = str(Path(spec.run_dir).relative_to(output))
    if stand_in_lpips_unless_on_disk():
        record.notes.append("LPIPS not measured: AlexNet weights are not on disk (nothing is downloaded).")
    config = build_config(spec)
    config.save_config()
    record.config = str((config.get_base_dir() / "config.yml").relative_to(output))
    if spec.num_devices == 1:
        _set_random_seed(config.machine.seed)
        return train_and_record(spec, config, record)
    import torch.multiprocessing as mp

    result = Path(spec.run_dir) / "rank0-record.json"
    init = f"file://{Path(spec.run_dir).resolve()}/rendezvous-{os.getpid()}"
    mp.spawn(_rank, args=(spec, config, record, init, result), nprocs=spec.num_devices, join=True)
    return RunRecord.from_dict(json.loads(result.read_text()))


def _rank(rank: int, spec: RunSpec, config, record: RunRecord, init: str, result: Path) -> None:
    """One GPU (or CPU process) of a multi-GPU run, as nerfstudio's launcher sets it up, with its per-rank seed."""
    import torch.distributed as dist

    cuda = spec.device.startswith("cuda")
    if cuda:
        torch.cuda.set_device(rank)
    dist.init_process_group("nccl" if cuda else "gloo", init_method=init, rank=rank, world_size=spec.num_devices)
    _set_random_seed(config.machine.seed + rank)
    record = train_and_record(spec, config, record, rank=rank)
    if rank == 0:
        write_json(result, record.to_dict())
    dist.barrier()
    dist.destroy_process_group()


def train_and_record(spec: RunSpec, config, record: RunRecord, rank: int = 0) -> RunRecord:
    """Train (rank 0: with the clock and the held-out evaluations) and fill in the record."""
    from nerfstudio.engine.callbacks import TrainingCallback, TrainingCallbackLocation

    trainer = config.setup(local_rank=rank, world_size=spec.num_devices)
    trainer.setup()
    if rank > 0:
        trainer.train()
        return record

    datamanager = trainer.pipeline.datamanager
    data = Path(spec.data)
    names = [_relative_name(p, data) for p in datamanager.eval_dataset.image_filenames]
    train_names = {_relative_name(p, data) for p in datamanager.train_dataset.image_filenames}
    if not names:
        raise SystemExit("The scene has no held-out (eval split) views: nothing to compare on.")
    if train_names & set(names):
        raise SystemExit(f"Held-out views are also training views: {sorted(train_names & set(names))[:5]}.")
    record.heldout_views, record.num_train_views = names, len(train_names)

    clock = TrainingClock(
        spec,
        trainer._start_step,
        trainer.config.max_num_iterations,  # steps of this run (bytesplat on N GPUs: --steps / N)
        evaluate_all=lambda: evaluate(trainer.pipeline, names),
        evaluate_final=lambda: evaluate(trainer.pipeline, names, save=spec),
    )
    # the clock starts before any other per-step callback, and evaluates after all of them (densification included)
    trainer.callbacks.insert(0, TrainingCallback([TrainingCallbackLocation.BEFORE_TRAIN_ITERATION], clock.before_step))
    trainer.callbacks.append(TrainingCallback([TrainingCallbackLocation.AFTER_TRAIN_ITERATION], clock.after_step))
    trainer.train()
    if clock.t0 is None:
        raise SystemExit("Training ran no step.")
    if clock.final_views is None:  # stopped early (Ctrl-C / SIGTERM): evaluate what there is
        clock.final_views = evaluate(trainer.pipeline, names, save=spec)

    views = clock.final_views
    record.views = views
    record.psnr = float(np.mean([v.psnr for v in views]))
    record.ssim = float(np.mean([v.ssim for v in views]))
    lpips = [v.lpips for v in views]
    record.lpips = float(np.mean(lpips)) if lpips and all(v is not None for v in lpips) else None
    record.steps = round(clock.steps_done * spec.steps / clock.total_steps)  # in views, as --steps counts them
    record.startup_s = clock.first_step_at - spec.launched_at if spec.launched_at else None
    record.train_s = clock.train_s
    record.eval_s = clock.eval_s
    record.step_ms = 1000.0 * record.train_s / max(1, clock.steps_done) if record.train_s is not None else None
    record.curve = clock.curve
    record.peak_mem = clock.peak_mem
    num_points = getattr(trainer.pipeline.model, "num_points", None)
    record.splats = int(num_points) if num_points is not None else None
    stats = getattr(trainer, "stats", None)  # bytesplat's RunStats; other methods have none
    if spec.num_devices > 1 and stats is not None:
        record.bytes_exchanged = stats.exchange_sent_bytes
    record.status = "ok"
    return record


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        raise SystemExit("usage: python -m bytesplat_ns.compare.worker <spec.json>")
    spec = RunSpec(**json.loads(Path(argv[0]).read_text()))
    record = run(spec)
    write_json(Path(spec.run_dir) / "record.json", record.to_dict())
    print(f"bytesplat-compare worker: {record.label} done, held-out PSNR {record.psnr:.2f} dB")


if __name__ == "__main__":
    main()
