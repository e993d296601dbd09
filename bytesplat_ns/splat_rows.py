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
from functools import partial

import torch
from gsplat.strategy.ops import _update_param_with_optimizer
from torch import Tensor

from bytesplat_ns.capacity_rungs import rung_above

INERT = {"means": 1e11, "scales": -20.0, "quats": 0.0, "opacities": -1e4}
"""Value of an inert row's entries, by parameter (others: 0). quats: (1, 0, 0, 0), set apart."""


def fill_inert(name: str, rows: Tensor) -> None:
    """Write inert values into `rows` ([R, ...] of parameter `name`), in place."""
    rows.fill_(INERT.get(name, 0.0))
    if name == "quats":
        rows[:, 0] = 1.0


def _held_copy(value: Tensor, target: Tensor | None, capacity: int, name: str | None = None) -> Tensor:
    """`value` ([live, ...]) as the leading rows of `target` if that has `capacity` rows, else of a new tensor of that
    many; the rows after it inert (parameter `name`) or zero (None). -> the tensor written. Nothing to write where
    `value` is the view `release` made of `target`: an edit left it alone."""
    if target is None or target.shape[0] != capacity:
        target = value.new_empty((capacity, *value.shape[1:]))
    elif target.data_ptr() == value.data_ptr():
        return target
    target[: value.shape[0]].copy_(value)
    rest = target[value.shape[0] :]
    if name is None:
        rest.zero_()
    else:
        fill_inert(name, rest)
    return target


def _held_param(name: str, live: torch.nn.Parameter, *, held: torch.nn.Parameter | None, capacity: int):
    """gsplat's param_fn for `hold`: `live` written into `held` (kept where it has `capacity` rows), else into a new
    Parameter."""
    data = _held_copy(live.data, held.data if held is not None else None, capacity, name)
    same = held is not None and data.data_ptr() == held.data_ptr()
    return held if same else torch.nn.Parameter(data, requires_grad=live.requires_grad)


def _held_moment(key: str, value: Tensor, *, held: dict, capacity: int) -> Tensor:
    """gsplat's optimizer_fn for `hold`: an Adam moment written into the held one of `key`, if any."""
    return _held_copy(value, held.get(key), capacity)


@dataclass
class SplatRows:
    """The live count of splats held at `capacity` rows, and the moves between held and live-only tensors.

    The moves swap parameters and their optimizer state as gsplat's refine operations do (its
    `_update_param_with_optimizer`: every optimizer state but `step` is per row), and take every tensor of the
    strategy state as per row, as they do."""

    live: int
    """Splats in use: the leading rows of every held tensor."""
    granule: int = 1 << 12
    """Capacities are rungs above multiples of this many rows (capacity_rungs.py)."""

    @property
    def capacity(self) -> int:
        return rung_above(self.live, self.granule)

    @torch.no_grad()
    def release(self, params, optimizers: dict, state: dict) -> tuple[dict, dict]:
        """Put views of the live rows in place of the held parameters (in `params` and their optimizers) and
        statistics. -> the held tensors (parameters with their optimizer state, statistics), for `hold`. `params`:
        name -> Parameter, one optimizer of one parameter per name (nerfstudio's splatfacto)."""
        live = self.live
        held_params = {name: (param, dict(optimizers[name].state.get(param, {}))) for name, param in params.items()}
        _update_param_with_optimizer(
            lambda name, param: torch.nn.Parameter(param.data[:live], requires_grad=param.requires_grad),
            lambda key, value: value[:live],
            params,
            optimizers,
        )
        held_state = {key: value for key, value in state.items() if torch.is_tensor(value)}
        state.update({key: value[:live] for key, value in held_state.items()})
        return held_params, held_state

    @torch.no_grad()
    def hold(self, params, optimizers: dict, state: dict, held: tuple[dict, dict] | None = None) -> None:
        """Hold `params` (the live splats, as `release` left them or an edit made them), their moments and the
        statistics at the capacity of their count: in the `held` tensors where that capacity is theirs, else in
        new ones."""
        self.live = len(params["means"])
        capacity = self.capacity
        held_params, held_state = held or ({}, {})
        for name in list(params):
            param, moments = held_params.get(name, (None, {}))
            _update_param_with_optimizer(
                partial(_held_param, held=param, capacity=capacity),
                partial(_held_moment, held=moments, capacity=capacity),
                params,
                optimizers,
                names=[name],
            )
        for key, value in state.items():
            if torch.is_tensor(value):
                state[key] = _held_copy(value, held_state.get(key), capacity)

    def recount(self, opacities: Tensor) -> None:
        """Count the live rows anew from `opacities` ([capacity, ...] logits: the inert rows hold exactly INERT's),
        after the held tensors were replaced wholesale (the non-finite guard's restore). One host sync."""
        inert = (opacities.reshape(opacities.shape[0], -1)[:, 0] == INERT["opacities"]).sum()
        self.live = opacities.shape[0] - int(inert)
