"""ByteSplat's trainer: nerfstudio's Trainer with the failure handling a long run needs.

- The scene is checked before anything is cached (input_checks); a bad one exits with the fix, and the
  run folder created for it is removed.
- Non-finite losses or gradients are caught without a per-step host sync (finite_guard); the logged loss and
  metrics are read a few steps late (train_log), so logging makes the host wait neither.
- Ctrl-C or SIGTERM stops after the current step and writes a final checkpoint; every checkpoint is
  written to a temporary file first and renamed, so an interrupted write never replaces a good one.
- Out of GPU memory while densifying: a checkpoint, then a message naming the splat count and the cap.
- The progress table shows the latest held-out PSNR; training ends with a summary.

With --machine.num-devices N (and nerfstudio's multi-machine flags) every rank runs this trainer on its own
GPU (`torch.cuda.set_device(local_rank)` before anything touches CUDA) and its own camera each step, so a step
trains on N views; counts of steps in the config are read as counts of views (view_schedule.py). Rank 0
alone runs the viewer, evaluates, logs and writes checkpoints. Pause/stop requests reach every rank
(run_control.py); a rank that dies makes the others exit within a minute (rank_watchdog.py).
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
import torch.distributed as dist
from nerfstudio.engine.callbacks import TrainingCallback, TrainingCallbackLocation
from nerfstudio.engine.trainer import Trainer, TrainerConfig
from nerfstudio.utils import writer
from nerfstudio.utils.misc import step_check
from nerfstudio.utils.rich_utils import CONSOLE
from rich.markup import escape
from rich.panel import Panel
from rich.table import Table
from torch import Tensor

from bytesplat_ns import adam_all_groups
from bytesplat_ns.adam_all_groups import AdamAllGroups
from bytesplat_ns.cpu_share import pin_to_cpu_share
from bytesplat_ns.finite_guard import NonFiniteGuard
from bytesplat_ns.grad_compaction import SparseRowExchange
from bytesplat_ns.input_checks import BadInputError, check_data_path
from bytesplat_ns.late_update import LateUpdate
from bytesplat_ns.model import SplatOutOfMemoryError
from bytesplat_ns.phase_clock import PhaseClock
from bytesplat_ns.rank_watchdog import RankWatchdog
from bytesplat_ns.run_control import RunControl
from bytesplat_ns.run_stats import RunStats
from bytesplat_ns.step_graph import StepGraph, detach_outputs, ineligible
from bytesplat_ns.step_profile import StepProfiler
from bytesplat_ns.train_log import LateLogValues, flush_log_writers, log_timing_at_log_steps
from bytesplat_ns.view_schedule import per_step_views, rescale_resumed_optimizers, resumed_start_step


@dataclass
class ByteSplatTrainerConfig(TrainerConfig):
    _target: type = field(default_factory=lambda: ByteSplatTrainer)
    nonfinite_check_every: int = 100
    """Read the non-finite flag (one host sync) every this many steps; 0 turns the guard off."""
    summary_eval: bool = True
    """Evaluate every held-out view when training ends, for the closing summary."""
    pin_cpus: bool = True
    """With several GPUs on a machine, bind each rank to its own share of the CPU cores (cpu_share.py)."""
    profile_steps: int = 0
    """Profile this many training steps with torch.profiler (host and GPU time, launches, host syncs per step) and
    write the summary to <run folder>/step_profile.json (other ranks: step_profile_rank<r>.json); 0: off."""
    profile_start: int = 500
    """Where the profile starts (after warm-up), counted in views like every count here (view_schedule.py)."""
    profile_trace: bool = False
    """With --profile-steps: also write the profile's timeline, a gzipped Chrome trace, to
    <run folder>/step_trace.json.gz (other ranks: step_trace_rank<r>.json.gz)."""
    cuda_graph: bool = True
    """On one CUDA GPU with the fused renderer: record the training step as a CUDA graph and replay it, recording
    again when what it baked in changes (step_graph.py says when it applies). False: every step runs op by op."""
    hold_splat_rows: bool = True
    """With the step graph: hold the splats' rows at a capacity on rungs about 9% apart, the rows past the live
    splats inert, so a refine that keeps the count within its rung leaves the recorded graph valid (splat_rows.py)
    instead of recording it again after a step op by op. False: the tensors hold the live splats only."""
    cuda_graph_several_gpus: bool = True
    """With several GPUs: replay each rank's step, the exchange's NCCL collectives inside, as a CUDA graph too (the
    compacted exchange with its kernels, or the screen exchange). On two H200s it trained lego at 1,105-1,166 views/s
    with one GPU's held-out PSNR; op by op two GPUs trained 295 views/s (benchmarks/RESULTS.md, thirty-eighth and
    eighth sessions). False: every rank runs its steps op by op."""
    adam_one_launch: bool = True
    """On CUDA: step every parameter group's Adam in one kernel launch (adam_all_groups.py). False: nerfstudio's
    per-group step (torch's fused Adam, two launches per group)."""
    adam_visible_only: bool = False
    """With the one-launch Adam: update only the rows of splats this step's view sees (radius > 0); the others keep
    their parameters and moments (Taming 3DGS's sparse Adam)."""

    def __post_init__(self) -> None:
        # Runs for every construction, defaults included: only values no default has are checked here.
        machine = self.machine
        if machine.device_type == "cuda" and machine.num_devices > max(1, torch.cuda.device_count()):
            _exit(
                f"--machine.num-devices {machine.num_devices} asks for more GPUs than this machine has "
                f"({torch.cuda.device_count()}). Lower it, or use --machine.device-type cpu."
            )
        if machine.device_type != "cuda" and machine.num_devices * machine.num_machines > 1:
            _exit(
                "Several processes need CUDA GPUs: nerfstudio's launcher starts them over NCCL only. On the CPU "
                "train with one process (drop --machine.num-devices/--machine.num-machines)."
            )


def _exit(message: str) -> None:
    CONSOLE.print(f"[bold red]{message}[/bold red]")
    raise SystemExit(2)


class ByteSplatTrainer(Trainer):
    config: ByteSplatTrainerConfig

    def __init__(self, config: ByteSplatTrainerConfig, local_rank: int = 0, world_size: int = 1) -> None:
        self.startup_marks = {"trainer": time.time()}  # after the imports and the command line (RunStats)
        if config.machine.device_type == "cuda" and torch.cuda.is_available():
            torch.cuda.set_device(local_rank)  # before anything touches CUDA: nerfstudio never does this
        self.rank = dist.get_rank() if world_size > 1 else 0
        if world_size > 1:
            self._share_cpus(config, local_rank)
        self.control: RunControl | None = None
        self.late: LateUpdate | None = None  # one step late (set up with the rest, `setup`)
        self._stop_training = False
        self.watchdog: RankWatchdog | None = None
        if world_size > 1 and self.rank != 0:
            config.vis = "tensorboard"  # nerfstudio would start a viewer on each machine's local rank 0; writers
            # are rank 0's only, so this just keeps the viewer off here
        super().__init__(per_step_views(config, world_size), local_rank, world_size)

    @staticmethod
    def _share_cpus(config: ByteSplatTrainerConfig, local_rank: int) -> None:
        """Several ranks on this machine: each its own cores (cpu_share.py) and a thread pool to match; nerfstudio's
        launcher would leave every rank with one thread per core of the machine."""
        local_ranks = max(1, config.machine.num_devices)
        cpus = pin_to_cpu_share(local_rank, local_ranks) if config.pin_cpus else None
        if "OMP_NUM_THREADS" not in os.environ:
            torch.set_num_threads(max(1, len(cpus) if cpus else (os.cpu_count() or 1) // local_ranks))

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    # Pause and stop: with several ranks the loop obeys what the ranks agreed on, not one rank's wish.
    def _agreed(self) -> RunControl | None:
        """The run control (None with one process), brought up to date first while paused."""
        if self.control is not None and self.control.agreed_state == "paused":
            self.control.poll_paused()
        return self.control

    @property
    def training_state(self) -> str:
        control = self._agreed()
        if control is None:
            return self._training_state
        return "completed" if control.requested_state == "completed" else control.agreed_state

    @training_state.setter
    def training_state(self, value: str) -> None:
        self._training_state = value
        if self.control is not None:
            self.control.requested_state = value

    @property
    def stop_training(self) -> bool:
        control = self._agreed()
        return self._stop_training if control is None else control.agreed_stop

    @stop_training.setter
    def stop_training(self, value: bool) -> None:
        self._stop_training = value
        if self.control is not None:
            self.control.requested_stop = value

    def setup(self, test_mode: Literal["test", "val", "inference"] = "val") -> None:
        try:
            if self.device.startswith("cuda") and not torch.cuda.is_available():
                raise BadInputError("No CUDA GPU is visible. Train on the CPU with --machine.device-type cpu.")
            if test_mode != "inference":
                check_data_path(
                    self.config.pipeline.datamanager.data or self.config.pipeline.datamanager.dataparser.data
                )
            super().setup(test_mode)
            self.startup_marks["pipeline"] = time.time()
            self.pipeline.model.strategy.seed = self.config.machine.seed
            if test_mode != "inference":
                self.pipeline.datamanager.cached_train  # noqa: B018  (load the images now, not in the first step)
                self.startup_marks["images"] = time.time()
            self._resume_on_another_gpu_count()
            if self.world_size > 1:
                self._join_ranks()
        except BadInputError as error:
            if self.is_main:
                self._remove_unused_run_folder()
            _exit(str(error))
        self.guard = NonFiniteGuard(self.config.nonfinite_check_every)
        self.log_values = LateLogValues(self.config.logging.steps_per_log)
        log_timing_at_log_steps(self.config.logging.steps_per_log)
        self.stats = RunStats(views_per_step=self.world_size, startup_unix=self.startup_marks)
        suffix = "" if self.is_main else f"_rank{self.rank}"
        base = self.config.get_base_dir()
        trace = base / f"step_trace{suffix}.json.gz" if self.config.profile_trace else None
        self.profiler = StepProfiler(self.config.profile_start, self.config.profile_steps,
                                     base / f"step_profile{suffix}.json", trace)  # fmt: skip
        self._time_iterations()
        self._setup_adam()
        self.late = self._one_step_late()
        if self.pipeline.exchanges_screen and (self.mixed_precision or self.accumulates_gradients):
            _exit(
                "--pipeline.exchange screen sets the splats' gradients anew each step: it trains without mixed "
                "precision and gradient accumulation. Drop those options or use --pipeline.exchange compact."
            )
        self.graph_off = "--cuda-graph False" if not self.config.cuda_graph else ineligible(self)
        self.step_graph = StepGraph(self, self._graph_body) if self.graph_off is None else None
        if self.step_graph is not None and self.config.hold_splat_rows:
            self.pipeline.model.hold_rows(self.optimizers.optimizers)
        self._say_why_op_by_op()
        self.stop_requested = False
        self.heldout_psnr: float | None = None
        self.startup_marks["setup"] = time.time()

    def _one_step_late(self) -> LateUpdate | None:
        """With --pipeline.exchange-one-step-late True and several ranks, the late update (late_update.py)."""
        exchange = self.pipeline.exchange
        if not (isinstance(exchange, SparseRowExchange) and exchange.one_step_late):
            return None
        if self.mixed_precision or self.accumulates_gradients:
            _exit(
                "--pipeline.exchange-one-step-late True applies each step's averaged gradients at the next step: it "
                "trains without mixed precision and gradient accumulation. Drop those options or the late exchange."
            )
        return LateUpdate(exchange)

    def _say_why_op_by_op(self) -> None:
        """On CUDA, unless asked for (--cuda-graph False): say at start-up that the step will not be replayed, and
        why, since that makes a host-bound step several times slower (benchmarks/RESULTS.md)."""
        if self.is_main and self.device.startswith("cuda") and self.config.cuda_graph and self.graph_off:
            CONSOLE.print(
                "[yellow]bytesplat: each training step runs op by op, not replayed as a CUDA graph: "
                f"{escape(self.graph_off)}. Where the host sets the pace (small scenes) that makes a step several "
                "times slower."
            )

    def _setup_adam(self) -> None:
        config = self.config
        why = (
            "--adam-one-launch False"
            if not config.adam_one_launch
            else adam_all_groups.ineligible(self.optimizers, self.device, self.mixed_precision)
        )
        if why is not None and config.adam_visible_only:
            _exit(f"--adam-visible-only True needs the one-launch Adam, which is off here: {why}. Drop the option.")
        if config.adam_visible_only and self.world_size > 1:
            _exit(
                "--adam-visible-only True trains on one GPU only: each rank sees another view, so the ranks would "
                "update different splats and drift apart. Drop the option or train on one GPU."
            )
        self.adam_off = why
        self.adam = AdamAllGroups(self.optimizers, self.device, config.adam_visible_only) if why is None else None

    def _resume_on_another_gpu_count(self) -> None:
        """A checkpoint written with N views per step, resumed with M: continue at the same number of views."""
        saved = self.pipeline.model.loaded_views_per_step
        if self._start_step == 0 or saved == self.world_size:
            return
        start = resumed_start_step(self._start_step, saved, self.world_size)
        CONSOLE.print(
            f"Resuming a {saved}-GPU checkpoint on {self.world_size} GPU(s): step {self._start_step} -> {start} "
            "(the same number of views seen)."
        )
        self._start_step = start
        rescale_resumed_optimizers(self.optimizers, self.config, start)

    def _time_iterations(self) -> None:
        """Stamp the start and end of every training iteration, callbacks (densification) included; the
        profiler (if asked for) wraps the same span."""

        def before_step(step: int) -> None:
            flush_log_writers()  # the step before's scalars, one tensorboard event
            self.profiler.before_step(step)
            self.stats.start_step()

        def after_step(step: int) -> None:
            self.stats.end_step()
            self.profiler.after_step(step)

        before = TrainingCallback([TrainingCallbackLocation.BEFORE_TRAIN_ITERATION], before_step)
        after = TrainingCallback([TrainingCallbackLocation.AFTER_TRAIN_ITERATION], after_step)
        self.callbacks = [before, *self.callbacks, after]

    def _join_ranks(self) -> None:
        """After the checkpoint (if any) is loaded: the same splats everywhere, then watch each other."""
        self.pipeline.broadcast_from_rank0()
        store = dist.distributed_c10d._get_default_store()
        self.control = RunControl(store=store, rank=self.rank)
        self.control.requested_state = self.control.agreed_state = self._training_state
        self.watchdog = RankWatchdog(store, self.rank, self.world_size)
        self.watchdog.start()

    def _remove_unused_run_folder(self) -> None:
        """The run folder holds only the config saved for a run that never started: remove it."""
        base = self.config.get_base_dir()
        if base.is_dir() and {p.name for p in base.iterdir()} <= {"config.yml"}:
            shutil.rmtree(base)

    # -- the step ---------------------------------------------------------------------------------
    def train_iteration(self, step: int):
        clock = self.stats.phase_clock()
        optimizers = self.optimizers
        if self.guard.due(step):  # before the forward pass: a restore then matches this step's densification stats
            restored = self.guard.check(step, optimizers.optimizers, self.pipeline.model.strategy_state)
            if restored:
                self.pipeline.model.recount_rows()  # the snapshot's live splats
            if restored and self.late is not None:
                self.late.drop_pending()  # rows of the bad steps, on every rank alike
        camera, batch = self.pipeline.datamanager.next_train(step)
        if self.adam is not None:
            self.adam.load_learning_rates()  # what the schedulers set last step, for the eager and replayed steps
        if self.late is not None:
            self.late.prepare(list(self.pipeline.model.gauss_params.values()))
        note = self.control.note() if self.control is not None else None
        replayed = self.step_graph.run(step, camera, batch, note) if self.step_graph is not None else None
        if replayed is not None:
            (loss, loss_dict, metrics_dict), exchange = replayed
            if exchange is not None:
                self.control.agree(exchange.notes)
            clock.lap("graph")
        else:
            optimizers.zero_grad_some(self._stepping(step))
            *outputs, exchange = self._update(step, camera, batch, clock)
            # nerfstudio keeps the logged values a step: with their autograd graph that would keep this step's
            # gradient accumulators alive into the next (a replay's outputs are detached already)
            loss, loss_dict, metrics_dict = detach_outputs(outputs)
        scale = self.grad_scaler.get_scale()
        self.grad_scaler.update()
        if scale <= self.grad_scaler.get_scale():
            optimizers.scheduler_step_all(step)
        clock.lap("optimizer")
        self.stats.add_exchange(exchange)
        edits = self.pipeline.model.edits_splats_at(step)  # the callbacks refine, reset or cap next
        if self.late is not None:
            self.late.pending = True  # this step's rows, packed
            if edits or step_check(step, self.config.steps_per_save):  # or nerfstudio's loop writes a checkpoint
                self._apply_pending(step)
        if edits:
            self.pipeline.splats_renumbered()
        return self.log_values(step, loss, loss_dict, metrics_dict)

    def _stepping(self, step: int) -> list[str]:
        """The parameter groups that take an optimizer step at `step` (gradient accumulation)."""
        return [g for g in self.optimizers.parameters if step % self.gradient_accumulation_steps[g] == 0]

    def _update(self, step: int, camera, batch: dict, clock: PhaseClock, guard_step: Tensor | None = None):
        """Forward, backward, gradient exchange (several ranks), non-finite guard and optimizer step of one
        camera: -> (loss, loss_dict, metrics_dict, exchange stats or None). Recorded as the step graph's body
        (step_graph.py) with `guard_step`, the step number on the device. One step late (late_update.py), the
        exchange, the guard and the optimizer step are the step before's, and this step's rows are packed for the
        next."""
        late, eager = self.late, guard_step is None
        judged = None
        if late is not None:
            if eager:  # replayed: the step graph runs the exchange's host parts around the replay
                self.pipeline.begin_exchange(self.control.note())
            judged = late.gather(then=lambda: self._judge_averaged(step, guard_step))  # beside the render, replayed
            clock.lap("exchange")
        device_type = "cpu" if self.device.split(":")[0] in ("cpu", "mps") else "cuda"
        with torch.autocast(device_type=device_type, enabled=self.mixed_precision):
            _, loss_dict, metrics_dict = self.pipeline.train_loss_dict(camera, batch)
            loss = functools.reduce(torch.add, loss_dict.values())
        clock.lap("forward")
        if self.pipeline.exchanges_screen:  # the exchange carries the gradients on to the splats (screen_exchange.py)
            loss.backward(inputs=self.pipeline.model.screen.differentiable())
        else:
            self.grad_scaler.scale(loss).backward()
        self.pipeline.model.accumulate_densification_statistics()
        clock.lap("backward")
        if late is not None:
            return (loss, loss_dict, metrics_dict, self._update_one_step_late(step, guard_step, judged, clock))
        guarded_loss, exchange = loss, None
        if self.control is not None:  # several ranks: average the gradients, agree on pause/stop
            visible = self._visible_rows()
            if eager:
                exchange = self.pipeline.average_gradients(note=self.control.note(), visible=visible)
                self.control.agree(exchange.notes)
            else:  # recording the step graph: the exchange's host parts run around each replay (StepGraph.run)
                self.pipeline.exchange_rows(visible)
            guarded_loss = loss.detach().new_zeros(())  # judge the averaged gradients, the same on every rank
            clock.lap("exchange")
        self._step_optimizers(step, self._judge(step, guard_step, guarded_loss))
        return loss, loss_dict, metrics_dict, exchange

    def _update_one_step_late(self, step: int, guard_step: Tensor | None, judged: Tensor | None, clock: PhaseClock):
        """After this step's backward, one step late: the optimizer step of the step before's averaged gradients (if
        they are a step's; `judged`: the guard's flag of them), this step's rows packed for the next. -> the exchange
        stats when run op by op."""
        late, params = self.late, list(self.pipeline.model.gauss_params.values())
        late.join()
        clock.lap("exchange")
        if late.pending:  # always, replayed (StepGraph.run)
            with late.as_gradients(params):
                self._step_optimizers(step, judged)
        clock.lap("optimizer")
        self.pipeline.pack_for_later(self._visible_rows())
        clock.lap("exchange")
        if guard_step is not None:
            return None
        exchange = self.pipeline.end_exchange()
        self.control.agree(exchange.notes)
        return exchange

    def _judge_averaged(self, step: int, guard_step: Tensor | None) -> Tensor | None:
        """One step late: the guard's flag of the averaged gradients (`_judge`)."""
        params = list(self.pipeline.model.gauss_params.values())
        with self.late.as_gradients(params):
            return self._judge(step, guard_step, torch.zeros((), device=params[0].device))

    def _judge(self, step: int, guard_step: Tensor | None, loss: Tensor) -> Tensor | None:
        """The non-finite guard on `loss` and the gradients the parameters hold: -> [] bool on the device, True for a
        bad step (None: the guard is off). A bad step's gradients are zeroed unless the one-launch Adam steps: it
        skips on the flag."""
        if self.guard.check_every <= 0:
            return None
        return self.guard.after_backward(step if guard_step is None else guard_step, loss, self.optimizers.optimizers,
                                         zero_bad_grads=not self._one_launch(step))  # fmt: skip

    def _one_launch(self, step: int) -> bool:
        """Whether the one-launch Adam steps at `step` (every group steps; no gradient accumulation between)."""
        return self.adam is not None and len(self._stepping(step)) == len(self.optimizers.optimizers)

    def _step_optimizers(self, step: int, skip: Tensor | None) -> None:
        """The optimizer step of the gradients the parameters hold. `skip`: [] bool on the device, True: the one-launch
        Adam changes nothing (other optimizers step on the gradients the guard zeroed)."""
        if self._one_launch(step):
            info = self.pipeline.model.info
            self.adam.step(info.get("radii") if info else None, skip=skip)
        else:
            self.optimizers.optimizer_scaler_step_some(self.grad_scaler, self._stepping(step))

    def _apply_pending(self, step: int) -> None:
        """One step late, on every rank at the same step: apply the packed rows now (before a refine or opacity reset,
        a checkpoint, the end of training: late_update.py). Nothing (no collective) when none are pending."""
        late = self.late
        if late is None or not late.pending:
            return
        params = list(self.pipeline.model.gauss_params.values())
        late.prepare(params)
        self.pipeline.begin_exchange(self.control.note())  # an exchange like a step's, its notes agreed on
        judged = late.gather(then=lambda: self._judge_averaged(step, None))
        self.control.agree(self.pipeline.end_exchange().notes)
        with late.as_gradients(params):
            self._step_optimizers(step, judged)
        late.pending = False

    @property
    def accumulates_gradients(self) -> bool:
        """Whether a parameter group steps only every few steps, on the gradients summed over them."""
        return any(n != 1 for n in self.gradient_accumulation_steps.values())

    def _visible_rows(self) -> Tensor | None:
        """[N] int32 this step's screen radii, for the exchange to skip the culled splats' rows, which hold zeros
        (model.visible_radii); None while gradients accumulate over steps (an earlier view's rows)."""
        return None if self.accumulates_gradients else self.pipeline.model.visible_radii()

    def _graph_body(self, guard_step: Tensor, camera, batch: dict) -> tuple:
        """The step as the CUDA graph records it (no gradient accumulation there: every group steps)."""
        return self._update(self.step, camera, batch, PhaseClock({}), guard_step)[:3]

    # -- stopping, memory, checkpoints ------------------------------------------------------------
    def train(self) -> None:
        self.train_start = time.perf_counter()
        self.startup_marks["train"] = time.time()
        handlers = {}
        for sig in (signal.SIGINT, signal.SIGTERM):
            try:
                handlers[sig] = signal.signal(sig, self._request_stop)
            except ValueError:  # not the main thread: leave signals alone
                pass
        try:
            super().train()
            flush_log_writers()  # the last step's
            if self.watchdog is not None:
                self.watchdog.finish()
            if not self.is_main:  # rank 0 writes bytesplat_stats.json with its summary; the others beside it
                base = self.config.get_base_dir()
                base.mkdir(parents=True, exist_ok=True)
                self.stats.write(base / f"bytesplat_stats_rank{self.rank}.json", last_step=self.step)
        except SplatOutOfMemoryError as error:
            self._report_failure(error)
            self._out_of_memory(error)
        except BaseException as error:
            self._report_failure(error)
            if self.world_size > 1:
                what = escape(f"{type(error).__name__}: {error}")
                CONSOLE.print(
                    f"[bold red]bytesplat rank {self.rank}: training stopped: {what}. With several GPUs this usually "
                    "means one of the other ranks exited first: see its output above."
                )
            raise
        finally:
            if self.step_graph is not None:
                self.step_graph.release()  # before the launcher destroys the process group (StepGraph.release)
            for sig, handler in handlers.items():
                signal.signal(sig, handler)

    def _report_failure(self, error: BaseException) -> None:
        if self.watchdog is not None:
            self.watchdog.report_failure(f"{type(error).__name__}: {error}".strip())

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
        if not self.is_main:
            saved = "Rank 0 saves the checkpoints."
        elif len({p.shape[0] for p in model.gauss_params.values()}) == 1:
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
        """Nerfstudio's checkpoint, written atomically: a temporary file, then a rename. Rank 0 only. (One step late,
        the training loop applies the pending gradients first, at the steps it saves; a save from elsewhere, such as
        the legacy viewer's button, writes the splats without the last step's.)"""
        if not self.is_main:
            return
        self.stats.saved_unix[step] = time.time()
        self.checkpoint_dir.mkdir(parents=True, exist_ok=True)
        path = self.checkpoint_dir / f"step-{step:09d}.ckpt"
        tmp = path.with_suffix(".ckpt.tmp")
        with self.pipeline.model.live_rows(), open(tmp, "wb") as f:  # no inert rows in a checkpoint
            state = {
                "step": step,
                "pipeline": self.pipeline.state_dict(),
                "optimizers": {k: v.state_dict() for k, v in self.optimizers.optimizers.items()},
                "schedulers": {k: v.state_dict() for k, v in self.optimizers.schedulers.items()},
                "scalers": self.grad_scaler.state_dict(),
            }
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
        if not self.is_main:
            return
        super().eval_iteration(step)
        if step_check(step, self.config.steps_per_eval_image):
            psnr = [e["event"] for e in writer.EVENT_STORAGE if e["name"] == "Eval Images Metrics/psnr"]
            if psnr:
                writer.put_scalar(name=writer.EventName.CURR_TEST_PSNR, scalar=float(psnr[-1]), step=step)

    def _after_train(self) -> None:
        if self.stop_training and self.step > self._start_step:
            self.step -= 1  # the loop stopped before running this step
        self._apply_pending(self.step)  # every rank, before rank 0 evaluates and saves
        if isinstance(self.pipeline.exchange, SparseRowExchange):
            self.pipeline.exchange.close()  # every rank: regions the peers read (peer_rows.py)
        if not self.is_main:
            return
        if self.config.summary_eval and self.pipeline.datamanager.eval_dataset:
            self.pipeline.eval()
            self.heldout_psnr = float(self.pipeline.get_average_eval_image_metrics(step=self.step)["psnr"])
            self.pipeline.train()
        super()._after_train()  # nerfstudio's final checkpoint, before the summary writes its save time
        self._print_summary()

    def _graph_counts(self) -> dict[str, object]:
        graph = self.step_graph
        return {"graph_replays": graph.replays if graph else 0, "graph_recordings": graph.captures if graph else 0,
                "graph_record_s": graph.record_seconds if graph else 0.0,
                "graph_eager_steps": dict(graph.eager) if graph else {},
                "graph_recording_reasons": dict(graph.recorded) if graph else {}}  # fmt: skip

    def _print_summary(self) -> None:
        table = Table(show_header=False, box=None)
        minutes, seconds = divmod(time.perf_counter() - self.train_start, 60)
        table.add_row("Steps", f"{self.step + 1}" + (" (stopped early)" if self.stop_requested else ""))
        table.add_row("Training time", f"{int(minutes)} min {seconds:.0f} s")
        table.add_row("Splats", f"{self.pipeline.model.num_points:,}")
        if self.heldout_psnr is not None:
            views = len(self.pipeline.datamanager.eval_dataset)
            table.add_row("Held-out PSNR", f"{self.heldout_psnr:.2f} dB (mean over the {views} eval-split views)")
        for name, value in self.stats.summary_rows():
            table.add_row(name, value)
        if self.device.startswith("cuda"):
            graph = self.step_graph.summary() if self.step_graph is not None else f"off: {self.graph_off}"
            table.add_row("CUDA graph of the step", graph)
            table.add_row("Adam", self.adam.describe() if self.adam is not None else f"per group: {self.adam_off}")
        if self.pipeline.model.bins.used:
            table.add_row("Tile binning", f"{self.pipeline.model.bins.overflows} overflows (render/bin_capacity.py)")
        for event in self.guard.events:
            table.add_row("Non-finite step", event)
        base = self.config.get_base_dir()
        self.stats.write(base / "bytesplat_stats.json", heldout_psnr=self.heldout_psnr,
                         splats=self.pipeline.model.num_points, last_step=self.step,
                         binning_overflows=self.pipeline.model.bins.overflows, **self._graph_counts())  # fmt: skip
        table.add_row("Run folder", str(base))
        table.add_row("Config (for ns-eval/render/export)", str(base / "config.yml"))
        table.add_row("Checkpoints", str(self.checkpoint_dir))
        CONSOLE.print(Panel(table, title="[bold]bytesplat summary", expand=False))
