"""The training loss and metrics that nerfstudio logs, read from the GPU without making the host wait.

Every `--logging.steps-per-log` steps nerfstudio's trainer turns the step's loss and metric tensors into Python
floats for its writers: a host sync per value, which stalls the host behind the GPU's queue (and, with several
ranks, behind the slowest rank). Instead the values of the step `late` steps before each log step (STEPS_LATE,
at most steps-per-log) are copied to pinned host memory as that step ends (late_read.py), and the log step
hands those floats to the writers: each logged point is the loss and metrics of a step shortly before the one
it is logged at. The first log (step 0) is read directly.

nerfstudio also hands its writers three timing scalars at every step ("Train Iter (time)", "Train Rays / Sec",
"ETA (time)", each a running average over the last steps) and each scheduled learning rate ("learning_rate/means",
from its Optimizers.scheduler_step_all), and writes them out at once: for tensorboard, a protobuf record each, a
checksum in Python and a hand-over to a background writer thread that then competes with the training loop for
the interpreter. `LogStepWriter` passes those on only at log steps, like every other training value (a learning
rate decays smoothly; the console's running averages are unchanged: they never go through the writers; measured
in benchmarks/RESULTS.md, twenty-third and fiftieth sessions). `OneEventPerStep` writes a step's scalars to
tensorboard as one event (the same tags and values; tensorboard reads an event's several values as it reads one):
a log step's ten scalars took some 1.2 ms of host time as ten events and 0.24 ms as one on the CPU machine
(fiftieth session).

nerfstudio's console writer prints a line of its stats table at every log step: at a thousand steps a second a
hundred lines a second, each some 0.3 ms of host time (py-spy, lego on one H200, benchmarks/RESULTS.md,
forty-eighth session). `ConsoleEvery` lets a log step print only when the last line is
CONSOLE_EVERY_S old: about ten lines a second, the rate a person can read (and splatfacto's at its ~100 steps a
second); the line printed carries that step's values as before.
"""

from __future__ import annotations

import time

import nerfstudio.configs.base_config  # noqa: F401  (before nerfstudio.utils.writer: they import each other)
import torch
from nerfstudio.utils import comms, writer
from tensorboard.compat.proto.summary_pb2 import Summary
from torch import Tensor

from bytesplat_ns.late_read import STEPS_LATE, LateQueue

PER_STEP_TIMES = frozenset(e.value for e in (writer.EventName.ITER_TRAIN_TIME, writer.EventName.TRAIN_RAYS_PER_SEC,
                                             writer.EventName.ETA))  # fmt: skip
"""The timing scalars nerfstudio's training loop puts at every step."""
LEARNING_RATE = "learning_rate/"
"""The prefix of the learning rates nerfstudio's optimizers put at every step."""


def per_step(name: str) -> bool:
    """Whether nerfstudio puts the scalar `name` at every step (written at log steps only)."""
    return name in PER_STEP_TIMES or name.startswith(LEARNING_RATE)


class LateLogValues:
    def __init__(self, steps_per_log: int, steps_late: int = STEPS_LATE) -> None:
        self.every = steps_per_log
        self.late = max(1, min(steps_late, steps_per_log))
        """Each log step logs the values of the step this many steps before it."""
        self._queue = LateQueue(lag=1)  # read at the next log step

    def __call__(self, step: int, loss: Tensor, loss_dict: dict, metrics_dict: dict) -> tuple[object, dict, dict]:
        """What train_iteration returns for nerfstudio to log: floats read late at log steps, else as is."""
        if self.every <= 0:
            return loss, loss_dict, metrics_dict
        out = (loss, loss_dict, metrics_dict)
        if step % self.every == 0:
            for values, (pushed_at, losses, metrics) in self._queue.pop_ready():
                if pushed_at == step - self.late:
                    out = _floats(values, losses, metrics)
        if (step + self.late) % self.every == 0:
            scalars = [v for d in (loss_dict, metrics_dict) for v in d.values() if _scalar(v)]
            values = torch.stack([t.detach().float().reshape(()) for t in [loss, *scalars]])  # [1 + K]
            self._queue.push(values, tag=(step, dict(loss_dict), dict(metrics_dict)))
        return out


def _floats(values: list[float], loss_dict: dict, metrics_dict: dict) -> tuple[float, dict, dict]:
    """The loss and dicts of a pushed step, each scalar tensor replaced by its value, in the order stacked."""
    values = iter(values)
    loss = next(values)
    dicts = [{key: next(values) if _scalar(v) else v for key, v in d.items()} for d in (loss_dict, metrics_dict)]
    return loss, dicts[0], dicts[1]


def _scalar(value: object) -> bool:
    return torch.is_tensor(value) and value.numel() == 1


class LogStepWriter(writer.Writer):
    """An event writer (tensorboard, wandb, comet) that gets the per-step scalars (`per_step`) only at log steps (every
    `steps_per_log`, step 0 included) and everything else as it comes."""

    def __init__(self, inner: writer.Writer, steps_per_log: int) -> None:
        self.inner, self.every = inner, steps_per_log

    def write_scalar(self, name: str, scalar, step: int) -> None:
        if not per_step(name) or self.every <= 0 or step % self.every == 0:
            self.inner.write_scalar(name, scalar, step)

    def write_scalar_dict(self, name: str, scalar_dict: dict, step: int) -> None:
        self.inner.write_scalar_dict(name, scalar_dict, step)

    def write_image(self, name: str, image: Tensor, step: int) -> None:
        self.inner.write_image(name, image, step)

    def write_config(self, name: str, config_dict: dict, step: int) -> None:
        self.inner.write_config(name, config_dict, step)


class OneEventPerStep(writer.Writer):
    """nerfstudio's tensorboard writer with the scalars of a step held until `flush` (the start of the next step,
    flush_log_writers; or a scalar of another step) and written as one event. Dictionaries go through
    `write_scalar` value by value, with the tags nerfstudio's Writer gives them."""

    def __init__(self, tensorboard: writer.TensorboardWriter) -> None:
        self.tensorboard = tensorboard
        self.held: list[Summary.Value] = []
        """The scalars of step `held_step`, not yet written."""
        self.held_step = -1

    def write_scalar(self, name: str, scalar, step: int) -> None:
        if step != self.held_step:
            self.flush()
        self.held.append(Summary.Value(tag=name, simple_value=float(scalar)))  # as torch's SummaryWriter.add_scalar
        self.held_step = step

    def flush(self) -> None:
        """Write the held scalars, one event (only rank 0 writes, as nerfstudio's tensorboard writer)."""
        if self.held and comms.is_main_process():
            self.tensorboard.tb_writer._get_file_writer().add_summary(Summary(value=self.held), self.held_step)
        self.held = []

    def write_image(self, name: str, image: Tensor, step: int) -> None:
        self.tensorboard.write_image(name, image, step)

    def write_config(self, name: str, config_dict: dict, step: int) -> None:
        self.tensorboard.write_config(name, config_dict, step)


class ConsoleEvery:
    """nerfstudio's console writer's `write_stats_log`, printing at a log step only when its last print is `every_s`
    seconds old (other steps print nothing anyway)."""

    def __init__(self, write_stats_log, steps_per_log: int, every_s: float) -> None:
        self.inner, self.steps_per_log, self.every_s = write_stats_log, steps_per_log, every_s
        self.last = -float("inf")

    def __call__(self, step: int) -> None:
        if self.steps_per_log > 0 and step % self.steps_per_log == 0:
            now = time.perf_counter()
            if now - self.last < self.every_s:
                return
            self.last = now
        self.inner(step)


CONSOLE_EVERY_S = 0.1
"""Seconds between two lines of the console's stats table, at least."""


def flush_log_writers() -> None:
    """Write out the tensorboard scalars held (OneEventPerStep; called at the start of each step and after training)."""
    for w in writer.EVENT_WRITERS:
        if isinstance(w, LogStepWriter) and isinstance(w.inner, OneEventPerStep):
            w.inner.flush()


def log_timing_at_log_steps(steps_per_log: int) -> None:
    """Wrap nerfstudio's event writers (set up by its trainer) in LogStepWriter, tensorboard's in OneEventPerStep
    first; the console writer prints at most every CONSOLE_EVERY_S (ConsoleEvery)."""
    for w in writer.EVENT_WRITERS:
        if isinstance(w, writer.LocalWriter) and not isinstance(w.write_stats_log, ConsoleEvery):
            w.write_stats_log = ConsoleEvery(w.write_stats_log, steps_per_log, CONSOLE_EVERY_S)
    one_event = lambda w: OneEventPerStep(w) if isinstance(w, writer.TensorboardWriter) else w  # noqa: E731
    writer.EVENT_WRITERS[:] = [
        w if isinstance(w, (writer.LocalWriter, LogStepWriter)) else LogStepWriter(one_event(w), steps_per_log)
        for w in writer.EVENT_WRITERS
    ]
