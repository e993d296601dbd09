"""ByteSplat's trainer: nerfstudio's Trainer with the failure handling a long run needs.

- The scene is checked before anything is cached (input_checks); a bad one exits with the fix, and the
  run folder created for it is removed.
- Non-finite losses or gradients are caught without a per-step host sync (finite_guard).
- Ctrl-C or SIGTERM stops after the current step and writes a final checkpoint; every checkpoint is
  written to a temporary file first and renamed, so an interrupted write never replaces a good one.
- Out of GPU memory while densifying: a checkpoint, then a message naming the splat count and the cap.
- The progress table shows the latest held-out PSNR; training ends with a summary.
"""

from __future__ import annotations

import functools
import os
import shutil
import signal
import time
from dataclasses import dataclass, field
from typing import Literal

import torch
from nerfstudio.engine.trainer import Trainer, TrainerConfig
from nerfstudio.utils import writer
from nerfstudio.utils.misc import step_check
from nerfstudio.utils.rich_utils import CONSOLE
from rich.panel import Panel
from rich.table import Table

from bytesplat_ns.finite_guard import NonFiniteGuard
from bytesplat_ns.input_checks import BadInputError, check_data_path
from bytesplat_ns.model import SplatOutOfMemoryError


@dataclass
class ByteSplatTrainerConfig(TrainerConfig):
    _target: type = field(default_factory=lambda: ByteSplatTrainer)
    nonfinite_check_every: int = 100
    """Read the non-finite flag (one host sync) every this many steps; 0 turns the guard off."""
    summary_eval: bool = True
    """Evaluate every held-out view when training ends, for the closing summary."""

    def __post_init__(self) -> None:
        # Runs for every construction, defaults included: only values no default has are checked here.
        machine = self.machine
        if machine.device_type == "cuda" and machine.num_devices > max(1, torch.cuda.device_count()):
            _exit(
                f"--machine.num-devices {machine.num_devices} asks for more GPUs than this machine has "
                f"({torch.cuda.device_count()}). Lower it, or use --machine.device-type cpu."
            )
        if machine.num_devices * machine.num_machines > 1:
            _exit(
                f"bytesplat trains on one device for now; got {machine.num_devices} device(s) x "
                f"{machine.num_machines} machine(s). Drop --machine.num-devices/--machine.num-machines "
                "(multi-GPU training comes in its own release)."
            )


def _exit(message: str) -> None:
    CONSOLE.print(f"[bold red]{message}[/bold red]")
    raise SystemExit(2)


class ByteSplatTrainer(Trainer):
    config: ByteSplatTrainerConfig

    def setup(self, test_mode: Literal["test", "val", "inference"] = "val") -> None:
        try:
            if self.device.startswith("cuda") and not torch.cuda.is_available():
                raise BadInputError("No CUDA GPU is visible. Train on the CPU with --machine.device-type cpu.")
            if test_mode != "inference":
                check_data_path(
                    self.config.pipeline.datamanager.data or self.config.pipeline.datamanager.dataparser.data
                )
            super().setup(test_mode)
        except BadInputError as error:
            self._remove_unused_run_folder()
            _exit(str(error))
        self.guard = NonFiniteGuard(self.config.nonfinite_check_every)
        self.stop_requested = False
        self.heldout_psnr: float | None = None

    def _remove_unused_run_folder(self) -> None:
        """The run folder holds only the config saved for a run that never started: remove it."""
        base = self.config.get_base_dir()
        if base.is_dir() and {p.name for p in base.iterdir()} <= {"config.yml"}:
            shutil.rmtree(base)

    # -- the step ---------------------------------------------------------------------------------
    def train_iteration(self, step: int):
        optimizers = self.optimizers
        if self.guard.due(step):  # before the forward pass: a restore then matches this step's densification stats
            self.guard.check(step, optimizers.optimizers, self.pipeline.model.strategy_state)
        optimizers.zero_grad_some([g for g in optimizers.parameters if step % self.gradient_accumulation_steps[g] == 0])
        device_type = "cpu" if self.device.split(":")[0] in ("cpu", "mps") else "cuda"
        with torch.autocast(device_type=device_type, enabled=self.mixed_precision):
            _, loss_dict, metrics_dict = self.pipeline.get_train_loss_dict(step=step)
            loss = functools.reduce(torch.add, loss_dict.values())
        self.grad_scaler.scale(loss).backward()
        if self.guard.check_every > 0:
            self.guard.after_backward(step, loss, optimizers.optimizers)
        optimizers.optimizer_scaler_step_some(
            self.grad_scaler, [g for g in optimizers.parameters if step % self.gradient_accumulation_steps[g] == 0]
        )
        scale = self.grad_scaler.get_scale()
        self.grad_scaler.update()
        if scale <= self.grad_scaler.get_scale():
            optimizers.scheduler_step_all(step)
        return loss, loss_dict, metrics_dict

    # -- stopping, memory, checkpoints ------------------------------------------------------------
    def train(self) -> None:
        self.train_start = time.perf_counter()
        handlers = {}
        for sig in (signal.SIGINT, signal.SIGTERM):
            try:
                handlers[sig] = signal.signal(sig, self._request_stop)
            except ValueError:  # not the main thread: leave signals alone
                pass
        try:
            super().train()
        except SplatOutOfMemoryError as error:
            self._out_of_memory(error)
        finally:
            for sig, handler in handlers.items():
                signal.signal(sig, handler)

    def _request_stop(self, signum, frame) -> None:
        if self.stop_requested:  # a second Ctrl-C: stop now
            raise KeyboardInterrupt
        self.stop_requested = True
        self.stop_training = True
        self.config.viewer.quit_on_train_completion = True
        CONSOLE.print(f"[bold yellow]{signal.Signals(signum).name}: stopping after this step, saving a checkpoint.")

    def _out_of_memory(self, error: SplatOutOfMemoryError) -> None:
        torch.cuda.empty_cache()
        model = self.pipeline.model
        if len({p.shape[0] for p in model.gauss_params.values()}) == 1:
            self.save_checkpoint(self.step)
            saved = f"Saved a checkpoint of step {self.step} in {self.checkpoint_dir}."
        else:
            saved = (
                f"The splats were half-refined, so nothing was saved; the last checkpoint is in {self.checkpoint_dir}."
            )
        _exit(
            f"Out of GPU memory while densifying at step {error.step} with {error.num_splats:,} splats. {saved} "
            f"Cap the splat count with --pipeline.model.max-splats (e.g. {int(error.num_splats * 0.7):,}) and "
            "resume with --load-dir."
        )

    def save_checkpoint(self, step: int) -> None:
        """Nerfstudio's checkpoint, written atomically: a temporary file, then a rename."""
        self.checkpoint_dir.mkdir(parents=True, exist_ok=True)
        path = self.checkpoint_dir / f"step-{step:09d}.ckpt"
        tmp = path.with_suffix(".ckpt.tmp")
        state = {
            "step": step,
            "pipeline": self.pipeline.state_dict(),
            "optimizers": {k: v.state_dict() for k, v in self.optimizers.optimizers.items()},
            "schedulers": {k: v.state_dict() for k, v in self.optimizers.schedulers.items()},
            "scalers": self.grad_scaler.state_dict(),
        }
        with open(tmp, "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        if self.config.save_only_latest_checkpoint:
            for old in self.checkpoint_dir.glob("*.ckpt"):
                if old != path:
                    old.unlink()

    # -- progress and summary ---------------------------------------------------------------------
    def eval_iteration(self, step: int) -> None:
        super().eval_iteration(step)
        if step_check(step, self.config.steps_per_eval_image):
            psnr = [e["event"] for e in writer.EVENT_STORAGE if e["name"] == "Eval Images Metrics/psnr"]
            if psnr:
                writer.put_scalar(name=writer.EventName.CURR_TEST_PSNR, scalar=float(psnr[-1]), step=step)

    def _after_train(self) -> None:
        if self.stop_requested and self.step > self._start_step:
            self.step -= 1  # the loop stopped before running this step
        if self.config.summary_eval and self.pipeline.datamanager.eval_dataset:
            self.pipeline.eval()
            self.heldout_psnr = float(self.pipeline.get_average_eval_image_metrics(step=self.step)["psnr"])
            self.pipeline.train()
        self._print_summary()
        super()._after_train()

    def _print_summary(self) -> None:
        table = Table(show_header=False, box=None)
        minutes, seconds = divmod(time.perf_counter() - self.train_start, 60)
        table.add_row("Steps", f"{self.step + 1}" + (" (stopped early)" if self.stop_requested else ""))
        table.add_row("Training time", f"{int(minutes)} min {seconds:.0f} s")
        table.add_row("Splats", f"{self.pipeline.model.num_points:,}")
        if self.heldout_psnr is not None:
            views = len(self.pipeline.datamanager.eval_dataset)
            table.add_row("Held-out PSNR", f"{self.heldout_psnr:.2f} dB (mean over the {views} eval-split views)")
        for event in self.guard.events:
            table.add_row("Non-finite step", event)
        base = self.config.get_base_dir()
        table.add_row("Run folder", str(base))
        table.add_row("Config (for ns-eval/render/export)", str(base / "config.yml"))
        table.add_row("Checkpoints", str(self.checkpoint_dir))
        CONSOLE.print(Panel(table, title="[bold]bytesplat summary", expand=False))
