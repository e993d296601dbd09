"""What one training run of a study is given (RunSpec) and what it leaves behind (RunRecord), as JSON."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

Role = Literal["baseline", "candidate"]


@dataclass
class RunSpec:
    """Everything the worker needs for one run; the baseline and candidate runs of a pair differ only in `method`."""

    method: str
    """nerfstudio method name, as for ns-train (e.g. splatfacto, bytesplat)."""
    role: Role
    """Which side of the comparison this run is."""
    seed: int
    """TrainerConfig.machine.seed; both runs of a pair share it."""
    pair: int
    """Index of the pair (0, 1, ...); pair i uses the i-th seed."""
    data: str
    """Scene folder (absolute), passed as ns-train's --data."""
    steps: int
    """Training steps (--max-num-iterations)."""
    eval_every: int
    """Held-out PSNR is evaluated every this many steps and after the last one; its time is not training time."""
    device: str
    """TrainerConfig.machine.device_type: cpu or cuda."""
    num_devices: int
    """TrainerConfig.machine.num_devices."""
    extra_args: list[str]
    """Further ns-train options, given to both methods unchanged."""
    output_dir: str
    """The study's output folder (absolute); paths in the record are relative to it."""
    run_dir: str
    """Folder of this run: nerfstudio's run folder, renders/, record.json, log.txt."""
    gt_dir: str
    """Study-wide folder for the held-out ground-truth PNGs (written once, by the first run that gets there)."""
    launched_at: float = 0.0
    """time.time() just before the runner started the worker process [s since the epoch]."""
    gpus: list[int] | None = None
    """GPUs of the run's lane (--devices, numbered as bytesplat-compare sees them), given to the worker through
    CUDA_VISIBLE_DEVICES; None: no --devices, the environment is left as it is."""


@dataclass
class ViewMetrics:
    """One held-out view of one run at the end of training."""

    name: str
    """Image file name, relative to the scene folder."""
    psnr: float
    """[dB]"""
    ssim: float
    """[0, 1], higher is better."""
    lpips: float | None
    """AlexNet LPIPS, lower is better; None when its weights are not on disk (nothing is downloaded)."""
    render: str
    """The rendered view as PNG, relative to the study's output folder."""
    gt: str
    """The ground truth as PNG (composited over the model's eval background), relative to the output folder."""


@dataclass
class CurvePoint:
    """Held-out PSNR at one evaluation during training."""

    step: int
    """Steps completed when evaluated."""
    train_s: float
    """Training wall time up to here [s], evaluation time excluded."""
    psnr: float
    """Mean held-out PSNR over all held-out views [dB]."""


@dataclass
class RunRecord:
    """The outcome of one run; metrics are None when the run failed or the quantity does not apply."""

    method: str
    """nerfstudio method name."""
    role: Role
    """baseline or candidate."""
    seed: int
    """machine.seed of the run."""
    pair: int
    """Index of the pair the run belongs to."""
    status: Literal["ok", "failed"] = "failed"
    """ok: trained and evaluated; failed: see `error`."""
    error: str | None = None
    """The last lines of the run's output when it failed."""
    run_dir: str = ""
    """The run's folder, relative to the study's output folder."""
    config: str | None = None
    """nerfstudio's config.yml of the run (for ns-eval, ns-render, ns-export), relative to the output folder."""
    device: str = ""
    """Device type the run trained on."""
    steps: int = 0
    """Training steps completed."""
    psnr: float | None = None
    """Mean held-out PSNR at the end [dB]."""
    ssim: float | None = None
    """Mean held-out SSIM at the end."""
    lpips: float | None = None
    """Mean held-out LPIPS at the end; None without the AlexNet weights on disk."""
    startup_s: float | None = None
    """Process start to the first training step [s]: imports, data loading, model set-up."""
    train_s: float | None = None
    """Training wall time [s], from the first step to the end of the last, held-out evaluations excluded."""
    eval_s: float | None = None
    """Time spent in the held-out evaluations during training [s] (excluded from train_s)."""
    step_ms: float | None = None
    """Mean time per training step [ms] (train_s / steps)."""
    peak_mem: int | None = None
    """Peak GPU memory allocated by torch during training [bytes], held-out evaluations excluded; None on the CPU."""
    splats: int | None = None
    """Number of Gaussians at the end."""
    bytes_exchanged: int | None = None
    """Multi-GPU runs: bytes rank 0 sent in the gradient exchanges over the whole run; None with one process."""
    time_to_target: float | None = None
    """Training wall time [s] at which held-out PSNR first reached the same seed's baseline final PSNR; None if never.
    For the baseline itself: the time it first reached its own final PSNR. Filled in by the report."""
    target_psnr: float | None = None
    """The target used for time_to_target: the final PSNR of the baseline with the same seed [dB]."""
    wall_s: float | None = None
    """Whole worker process, start to exit [s], as the runner saw it."""
    gpus: list[int] | None = None
    """GPUs the run was given (its lane's, see RunSpec.gpus); None: no --devices."""
    curve: list[CurvePoint] = field(default_factory=list)
    """Held-out PSNR against training wall time, every eval_every steps and after the last step."""
    views: list[ViewMetrics] = field(default_factory=list)
    """Per held-out view metrics at the end, in the eval split's order."""
    heldout_views: list[str] = field(default_factory=list)
    """The eval split's image file names (relative to the scene folder)."""
    num_train_views: int | None = None
    """How many views the run trained on."""
    notes: list[str] = field(default_factory=list)
    """Anything about how the run was made that a reader should know (e.g. TORCHDYNAMO_DISABLE=1)."""

    @property
    def label(self) -> str:
        return f"{self.role} {self.method} seed {self.seed}"

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> RunRecord:
        known = {f.name for f in dataclasses.fields(cls)}
        values = {k: v for k, v in data.items() if k in known}
        values["curve"] = [CurvePoint(**p) for p in values.get("curve", [])]
        values["views"] = [ViewMetrics(**v) for v in values.get("views", [])]
        return cls(**values)


def write_json(path: Path, data: dict | list) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    tmp.replace(path)


@dataclass
class StudyConfig:
    """What a study compares and how; written at the top of report.json."""

    data: str
    """Scene folder (absolute)."""
    baseline: str
    """The current recipe's nerfstudio method."""
    candidate: str
    """The method considered instead."""
    steps: int
    """Training steps of every run."""
    seeds: list[int]
    """machine.seed of each pair, in order."""
    eval_every: int
    """Held-out PSNR evaluated every this many steps (and after the last) for the PSNR-time curves."""
    device: str
    """cpu or cuda, for every run."""
    num_devices: int
    """Devices per run."""
    limits: str
    """The preselected limits, as given."""
    extra_args: list[str]
    """ns-train options given to both methods."""
    output: str
    """The study's output folder (absolute)."""
    worse_db: float = 0.5
    """Views where the candidate's PSNR is lower by more than this [dB] (same seed) are shown side by side."""
    run_timeout_s: float | None = None
    """A run taking longer than this [s] is stopped and recorded as failed; None: no limit."""
    lanes: list[list[int]] | None = None
    """GPUs of each lane (--devices in groups of --num-devices); pair i ran on lane i % len(lanes), the lanes side by
    side. None: no --devices, one run at a time in the environment as it is."""
