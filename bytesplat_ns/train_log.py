"""The training loss and metrics that nerfstudio logs, read from the GPU without making the host wait.

Every `--logging.steps-per-log` steps nerfstudio's trainer turns the step's loss and metric tensors into Python
floats for its writers: a host sync per value, which stalls the host behind the GPU's queue (and, with several
ranks, behind the slowest rank). Instead the values of the step `late` steps before each log step (STEPS_LATE,
at most steps-per-log) are copied to pinned host memory as that step ends (late_read.py), and the log step
hands those floats to the writers: each logged point is the loss and metrics of a step shortly before the one
it is logged at. The first log (step 0) is read directly.

nerfstudio also hands its writers three timing scalars at every step ("Train Iter (time)", "Train Rays / Sec",
"ETA (time)", each a running average over the last steps) and writes them out at once: for tensorboard, three
protobuf records a step and a background writer thread that competes with the training loop for the
interpreter. `LogStepWriter` passes those three on only at log steps, like every other training value; the
console's running averages are unchanged (they never go through the writers). Measured in
benchmarks/RESULTS.md (twenty-third session).

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
from nerfstudio.utils import writer
from torch import Tensor

from bytesplat_ns.late_read import STEPS_LATE, LateQueue

PER_STEP_TIMES = frozenset(e.value for e in (writer.EventName.ITER_TRAIN_TIME, writer.EventName.TRAIN_RAYS_PER_SEC,
                                             writer.EventName.ETA))  # fmt: skip
"""The scalars nerfstudio's training loop puts at every step."""


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
    """An event writer (tensorboard, wandb, comet) that gets the per-step timing scalars only at log steps (every
    `steps_per_log`, step 0 included) and everything else as it comes."""

    def __init__(self, inner: writer.Writer, steps_per_log: int) -> None:
        self.inner, self.every = inner, steps_per_log

    def write_scalar(self, name: str, scalar, step: int) -> None:
        if name not in PER_STEP_TIMES or self.every <= 0 or step % self.every == 0:
            self.inner.write_scalar(name, scalar, step)

    def write_scalar_dict(self, name: str, scalar_dict: dict, step: int) -> None:
        self.inner.write_scalar_dict(name, scalar_dict, step)

    def write_image(self, name: str, image: Tensor, step: int) -> None:
        self.inner.write_image(name, image, step)

    def write_config(self, name: str, config_dict: dict, step: int) -> None:
        self.inner.write_config(name, config_dict, step)


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


def log_timing_at_log_steps(steps_per_log: int) -> None:
    """Wrap nerfstudio's event writers (set up by its trainer) in LogStepWriter; the console writer prints at most
    every CONSOLE_EVERY_S (ConsoleEvery)."""
    for w in writer.EVENT_WRITERS:
        if isinstance(w, writer.LocalWriter) and not isinstance(w.write_stats_log, ConsoleEvery):
            w.write_stats_log = ConsoleEvery(w.write_stats_log, steps_per_log, CONSOLE_EVERY_S)
    writer.EVENT_WRITERS[:] = [
        w if isinstance(w, (writer.LocalWriter, LogStepWriter)) else LogStepWriter(w, steps_per_log)
        for w in writer.EVENT_WRITERS
    ]
