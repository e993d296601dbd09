"""The training loss and metrics that nerfstudio logs, read from the GPU without making the host wait.

Every `--logging.steps-per-log` steps nerfstudio's trainer turns the step's loss and metric tensors into Python
floats for its writers: a host sync per value, which stalls the host behind the GPU's queue (and, with several
ranks, behind the slowest rank). Instead the values of the step `late` steps before each log step (STEPS_LATE,
at most steps-per-log) are copied to pinned host memory as that step ends (late_read.py), and the log step
hands those floats to the writers: each logged point is the loss and metrics of a step shortly before the one
it is logged at. The first log (step 0) is read directly.
"""

from __future__ import annotations

import torch
from torch import Tensor

from bytesplat_ns.late_read import STEPS_LATE, LateQueue


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
