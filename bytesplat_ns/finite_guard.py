"""Non-finite loss or gradients: skip the update on the device, check a flag every K steps, restore.

Each step, `after_backward` folds "loss and all gradients finite" into a device flag and zeroes the
gradients of a bad step (no host sync). Every `check_every` steps `check` reads the flag once: if a bad
step happened, parameters and optimizer state go back to the last good snapshot; otherwise a new
snapshot is taken. Training goes on either way.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from nerfstudio.utils.rich_utils import CONSOLE
from torch import Tensor


@dataclass
class _Snapshot:
    step: int
    params: dict[str, list[Tensor]]  # optimizer name -> its parameters' data
    states: dict[str, list[dict]]  # optimizer name -> its parameters' optimizer state


class NonFiniteGuard:
    def __init__(self, check_every: int) -> None:
        self.check_every = check_every
        self.bad: Tensor | None = None  # [] bool, on the device
        self.first_bad_step: Tensor | None = None  # [] int64, on the device
        self.snapshot: _Snapshot | None = None
        self.events: list[str] = []

    def after_backward(self, step: int | Tensor, loss: Tensor, optimizers: dict[str, torch.optim.Optimizer]) -> None:
        """`step`: the step number, or a [] int64 device tensor holding it (a replayed CUDA graph, step_graph.py).
        The flags are updated in place, so a replayed step updates the same flags as an eager one."""
        grads = [
            p.grad for opt in optimizers.values() for g in opt.param_groups for p in g["params"] if p.grad is not None
        ]
        # Every gradient's norm in one multi-tensor launch: not finite iff the gradient holds a NaN or an Inf (or
        # its squares overflow float32, a step as well skipped). A few launches in all, instead of three per
        # gradient: the step is bound by the host.
        norms = torch._foreach_norm(grads) if grads else []
        finite = torch.isfinite(torch.stack([loss.detach().float().reshape(()), *norms])).all()
        bad_now = ~finite
        for grad in grads:
            grad.masked_fill_(bad_now, 0.0)  # a bad step's update becomes (nearly) nil
        if self.bad is None:
            self.bad = torch.zeros((), dtype=torch.bool, device=loss.device)
            self.first_bad_step = torch.full((), -1, dtype=torch.int64, device=loss.device)
        newly_bad = bad_now & ~self.bad
        self.first_bad_step.copy_(torch.where(newly_bad, step, self.first_bad_step))
        self.bad |= bad_now

    def due(self, step: int) -> bool:
        return self.check_every > 0 and step % self.check_every == 0

    def check(self, step: int, optimizers: dict[str, torch.optim.Optimizer], strategy_state: dict) -> bool:
        """One host sync. Returns True when the state was restored."""
        if self.bad is None or not bool(self.bad):  # the sync, once every check_every steps
            self.snapshot = _take(step, optimizers)
            return False
        first = int(self.first_bad_step)
        if self.snapshot is None:
            message = f"non-finite loss or gradient at step {first}: those updates were skipped (no snapshot yet)"
        else:
            _restore(self.snapshot, optimizers)
            for key in ("grad2d", "count", "radii"):  # densification statistics start again
                strategy_state[key] = None
            message = (
                f"non-finite loss or gradient at step {first}: restored the state from before step {self.snapshot.step}"
            )
        CONSOLE.print(f"[bold yellow]{message}; training goes on.[/bold yellow]")
        self.events.append(message)
        self.bad.zero_()
        self.first_bad_step.fill_(-1)
        return True


def _take(step: int, optimizers: dict[str, torch.optim.Optimizer]) -> _Snapshot:
    params, states = {}, {}
    for name, opt in optimizers.items():
        group = [p for g in opt.param_groups for p in g["params"]]
        params[name] = [p.detach().clone() for p in group]
        states[name] = [
            {k: v.clone() if torch.is_tensor(v) else v for k, v in opt.state.get(p, {}).items()} for p in group
        ]
    return _Snapshot(step=step, params=params, states=states)


def _restore(snapshot: _Snapshot, optimizers: dict[str, torch.optim.Optimizer]) -> None:
    """In place: the Parameter objects the model and optimizers share stay the same objects."""
    for name, opt in optimizers.items():
        group = [p for g in opt.param_groups for p in g["params"]]
        opt.state.clear()
        for p, data, state in zip(group, snapshot.params[name], snapshot.states[name]):
            p.data = data.clone()
            if state:
                opt.state[p] = {k: v.clone() if torch.is_tensor(v) else v for k, v in state.items()}
