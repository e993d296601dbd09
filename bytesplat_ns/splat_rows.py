"""The splats' rows held at a capacity on rungs, so that a refine within it leaves the step graph as recorded.

A recorded step graph (step_graph.py) bakes in the addresses and the row count of every splat parameter, its Adam
moments and the densification statistics. gsplat's refine replaces all of them with tensors of the new count, so
after each refine the step after it ran op by op (its binning exact) and the next recorded the graph again: with
the refine itself, 33-37 ms of the GPU's timeline per refine on lego, some 65 refines in 7000 steps, whatever the
number of GPUs (benchmarks/RESULTS.md, thirty-second session).

With rows held, each of those tensors has `capacity` rows, a rung (capacity_rungs.py) at or above the live splat count:
the live splats first, then inert rows. An inert row lies at 1e11 along each axis (beyond the far plane, behind the
camera or far off screen for a pinhole camera near the scene: culled, so it takes no tile entry, no gradient and no
densification statistic), has zero opacity (logit -1e4; rendered, it would add nothing) and zero moments, so Adam leaves
it as it is. A refine (and anything else that edits the splats: the opacity reset, the splat cap) runs on the live rows
alone (`release`: views of them, what gsplat's operations expect); `hold` then copies the result into the held tensors,
refilling the rows past it with inert values, as long as the new count stays within the same rung. The Parameter
objects, the moments and the statistics keep their addresses, so the next step replays the recorded graph. Only a count
crossing a rung makes new tensors (and a recording).

Checkpoints are written released (the live splats only), so ns-export, ns-render and resuming see no inert row.
On lego (7000 steps, one H100) 23-24 recordings and 16 steps op by op remained of 71-74 and 68, and the training loop
took 1.27 ms per step against 1.41 (benchmarks/RESULTS.md, forty-seventh session).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from bytesplat_ns.capacity_rungs import rung_above

INERT = {"means": 1e11, "scales": -20.0, "quats": 0.0, "opacities": -1e4}
"""Value of an inert row's entries, by parameter (others: 0). quats: (1, 0, 0, 0), set apart."""

STATISTICS = ("grad2d", "count", "radii")
"""Densification statistics, one value per splat (strategy.py)."""


def fill_inert(name: str, rows: Tensor) -> None:
    """Write inert values into `rows` ([R, ...] of parameter `name`), in place."""
    rows.fill_(INERT.get(name, 0.0))
    if name == "quats":
        rows[:, 0] = 1.0


def _held_copy(value: Tensor, target: Tensor | None, capacity: int, name: str | None = None) -> Tensor:
    """`value` ([live, ...]) as the leading rows of `target` where that has `capacity` rows, else of a new tensor of
    that many; the rows after it inert (parameter `name`) or zero (None). -> the tensor written."""
    if target is None or target.shape[0] != capacity:
        target = value.new_empty((capacity, *value.shape[1:]))
    live = value.shape[0]
    if target.data_ptr() != value.data_ptr():  # else `value` is the view `release` made: unchanged
        target[:live].copy_(value)
    rest = target[live:]
    if name is None:
        rest.zero_()
    else:
        fill_inert(name, rest)
    return target


@dataclass
class SplatRows:
    """The live count of splats held at `capacity` rows, and the moves between held and live-only tensors."""

    live: int
    """Splats in use: the leading rows of every held tensor."""
    granule: int = 1 << 12
    """Capacities are rungs above multiples of this many rows (capacity_rungs.py)."""

    @property
    def capacity(self) -> int:
        return rung_above(self.live, self.granule)

    @torch.no_grad()
    def release(self, params, optimizers: dict, state: dict) -> dict:
        """Put views of the live rows in place of the held parameters (in `params` and their optimizers) and
        statistics. -> the held tensors, for `hold`. `params`: name -> Parameter, one optimizer of one parameter
        per name (nerfstudio's splatfacto)."""
        held = {}
        for name, param in list(params.items()):
            optimizer = optimizers[name]
            moments = optimizer.state.pop(param, {})
            view = torch.nn.Parameter(param.data[: self.live], requires_grad=param.requires_grad)
            if moments:
                optimizer.state[view] = {k: v[: self.live] if _per_row(k, v) else v for k, v in moments.items()}
            optimizer.param_groups[0]["params"] = [view]
            params[name] = view
            held[name] = (param, moments)
        for key in STATISTICS:
            if state.get(key) is not None:
                held[key] = state[key]
                state[key] = state[key][: self.live]
        return held

    @torch.no_grad()
    def hold(self, params, optimizers: dict, state: dict, held: dict | None = None) -> None:
        """Hold `params` (the live splats, as `release` left them or an edit made them), their moments and the
        statistics at the capacity of their count: in the `held` tensors where that capacity is theirs, else in
        new ones."""
        self.live = len(params["means"])
        capacity = self.capacity
        held = held or {}
        for name, live in list(params.items()):
            optimizer = optimizers[name]
            moments = optimizer.state.pop(live, {})
            param, old = held.get(name, (None, {}))
            if param is None or param.shape[0] != capacity:  # a new rung: new tensors
                param, old = None, {}
            data = _held_copy(live.data, param.data if param is not None else None, capacity, name)
            param = param if param is not None else torch.nn.Parameter(data, requires_grad=live.requires_grad)
            for key, value in moments.items():
                if _per_row(key, value):
                    moments[key] = _held_copy(value, old.get(key), capacity)
            if moments:
                optimizer.state[param] = moments
            optimizer.param_groups[0]["params"] = [param]
            params[name] = param
        for key in STATISTICS:
            if state.get(key) is not None:
                state[key] = _held_copy(state[key], held.get(key), capacity)

    def recount(self, opacities: Tensor) -> None:
        """Count the live rows anew from `opacities` ([capacity, ...] logits: the inert rows hold exactly INERT's),
        after the held tensors were replaced wholesale (the non-finite guard's restore). One host sync."""
        inert = (opacities.reshape(opacities.shape[0], -1)[:, 0] == INERT["opacities"]).sum()
        self.live = opacities.shape[0] - int(inert)


def _per_row(key: str, value) -> bool:
    """Whether optimizer state `key` holds one row per splat (Adam's moments; not its step count)."""
    return key != "step" and torch.is_tensor(value) and value.dim() > 0
