"""Non-finite loss or gradients: skip the update on the device, check a flag every K steps, restore.

Each step, `after_backward` folds "loss and all gradients finite" into a device flag and returns this step's
flag; the one-launch Adam (adam_all_groups.py) reads it and leaves a bad step's parameters and moments as they
are, and for any other optimizer the gradients of a bad step are zeroed (no host sync either way). Every
`check_every` steps `check` reads the flag once: if a bad step happened, parameters and optimizer state go back
to the last good snapshot; otherwise a new snapshot is taken. Training goes on either way.

The snapshot is one copy of every parameter and its Adam moments (three floats per parameter float: 1.4 GB
for 2M splats). While no refine has changed a shape it is refreshed in place; otherwise the old copy is
dropped before the new one is made, so there are never two.
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

    def after_backward(self, step: int | Tensor, loss: Tensor, optimizers: dict[str, torch.optim.Optimizer],
                       zero_bad_grads: bool = True) -> Tensor:  # fmt: skip
        """-> [] bool on the device, True when this step's loss or a gradient is not finite. `step`: the step
        number, or a [] int64 device tensor holding it (a replayed CUDA graph, step_graph.py). The flags are
        updated in place, so a replayed step updates the same flags as an eager one. `zero_bad_grads`: zero a
        bad step's gradients (False where the optimizer skips on the returned flag instead)."""
        grads = [
            p.grad for opt in optimizers.values() for g in opt.param_groups for p in g["params"] if p.grad is not None
        ]
        # Every gradient's norm in one multi-tensor launch: not finite iff the gradient holds a NaN or an Inf (or
        # its squares overflow float32, a step as well skipped). A few launches in all, instead of three per
        # gradient: the step is bound by the host.
        norms = torch._foreach_norm(grads) if grads else []
        finite = torch.isfinite(torch.stack([loss.detach().float().reshape(()), *norms])).all()
        bad_now = ~finite
        if zero_bad_grads:
            for grad in grads:
                grad.masked_fill_(bad_now, 0.0)  # a bad step's update becomes (nearly) nil
        if self.bad is None:
            self.bad = torch.zeros((), dtype=torch.bool, device=loss.device)
            self.first_bad_step = torch.full((), -1, dtype=torch.int64, device=loss.device)
        newly_bad = bad_now & ~self.bad
        self.first_bad_step.copy_(torch.where(newly_bad, step, self.first_bad_step))
        self.bad |= bad_now
        return bad_now

    def due(self, step: int) -> bool:
        return self.check_every > 0 and step % self.check_every == 0

    def check(self, step: int, optimizers: dict[str, torch.optim.Optimizer], strategy_state: dict) -> bool:
        """One host sync. Returns True when the state was restored."""
        if self.bad is None or not bool(self.bad):  # the sync, once every check_every steps
            if not _refresh(self.snapshot, step, optimizers):
                self.snapshot = None  # freed before the new copies are allocated
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


def _group(opt: torch.optim.Optimizer) -> list[Tensor]:
    return [p for g in opt.param_groups for p in g["params"]]


def _take(step: int, optimizers: dict[str, torch.optim.Optimizer]) -> _Snapshot:
    params, states = {}, {}
    for name, opt in optimizers.items():
        group = _group(opt)
        params[name] = [p.detach().clone() for p in group]
        states[name] = [
            {k: v.clone() if torch.is_tensor(v) else v for k, v in opt.state.get(p, {}).items()} for p in group
        ]
    return _Snapshot(step=step, params=params, states=states)


def _refresh(snapshot: _Snapshot | None, step: int, optimizers: dict[str, torch.optim.Optimizer]) -> bool:
    """Copy the current parameters and optimizer state into `snapshot`'s tensors when every name, key, shape and
    dtype still matches (no new memory); False (nothing copied) otherwise."""
    if snapshot is None or snapshot.params.keys() != optimizers.keys():
        return False
    targets, sources, plain = [], [], []  # plain: (saved state, its non-tensor values), none for torch's Adam
    for name, opt in optimizers.items():
        group = _group(opt)
        if len(group) != len(snapshot.params[name]):
            return False
        for p, saved, saved_state in zip(group, snapshot.params[name], snapshot.states[name]):
            state = opt.state.get(p, {})
            if state.keys() != saved_state.keys():
                return False
            tensors = {k: v for k, v in state.items() if torch.is_tensor(v)}
            pairs = [(saved, p.detach())] + [(saved_state[k], v) for k, v in tensors.items()]
            if any(not torch.is_tensor(t) or t.shape != v.shape or t.dtype != v.dtype or t.device != v.device
                   for t, v in pairs):  # fmt: skip
                return False
            targets += [t for t, _ in pairs]
            sources += [v for _, v in pairs]
            plain.append((saved_state, {k: v for k, v in state.items() if k not in tensors}))
    if targets:
        torch._foreach_copy_(targets, sources)
    for saved_state, values in plain:
        saved_state.update(values)
    snapshot.step = step
    return True


def _restore(snapshot: _Snapshot, optimizers: dict[str, torch.optim.Optimizer]) -> None:
    """In place: the Parameter objects the model and optimizers share stay the same objects."""
    for name, opt in optimizers.items():
        group = _group(opt)
        opt.state.clear()
        for p, data, state in zip(group, snapshot.params[name], snapshot.states[name]):
            p.data = data.clone()
            if state:
                opt.state[p] = {k: v.clone() if torch.is_tensor(v) else v for k, v in state.items()}
