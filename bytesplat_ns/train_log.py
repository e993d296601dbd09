"""The training loss and metrics that nerfstudio logs, read from the GPU without making the host wait.

Every `--logging.steps-per-log` steps nerfstudio's trainer turns the step's loss and metric tensors into Python
floats for its writers: a host sync per value, which stalls the host behind the GPU's queue (and, with several
ranks, behind the slowest rank). Instead the values of the step before each log step are copied to pinned host
memory as that step ends (late_read.py), and the log step hands those floats to the writers: each logged point
is the loss and metrics of the step just before the one it is logged at. The first log (step 0) is read
directly.
"""

from __future__ import annotations

import torch
from torch import Tensor

from bytesplat_ns.late_read import LateRead


class LateLogValues:
    def __init__(self, steps_per_log: int) -> None:
        self.every = steps_per_log
        self._pending: tuple[int, LateRead, dict, dict] | None = None

    def __call__(self, step: int, loss: Tensor, loss_dict: dict, metrics_dict: dict) -> tuple[object, dict, dict]:
        """What train_iteration returns for nerfstudio to log: floats read a step late at log steps, else as is."""
        if self.every <= 0:
            return loss, loss_dict, metrics_dict
        out = (loss, loss_dict, metrics_dict)
        if step % self.every == 0 and self._pending is not None and self._pending[0] == step - 1:
            out = self._floats()
        if (step + 1) % self.every == 0:
            scalars = [v for d in (loss_dict, metrics_dict) for v in d.values() if _scalar(v)]
            values = torch.stack([t.detach().float().reshape(()) for t in [loss, *scalars]])  # [1 + K]
            self._pending = (step, LateRead(values), dict(loss_dict), dict(metrics_dict))
        return out

    def _floats(self) -> tuple[float, dict, dict]:
        """The pending step's loss and dicts, each scalar tensor replaced by its value, in the order stacked."""
        _, late, loss_dict, metrics_dict = self._pending
        self._pending = None
        values = iter(late.tolist())
        loss = next(values)
        dicts = [{key: next(values) if _scalar(v) else v for key, v in d.items()} for d in (loss_dict, metrics_dict)]
        return loss, dicts[0], dicts[1]


def _scalar(value: object) -> bool:
    return torch.is_tensor(value) and value.numel() == 1
