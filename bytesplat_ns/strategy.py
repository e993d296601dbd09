"""Densification that stays identical on every rank: gsplat's DefaultStrategy (splatfacto's), with these changes.

1. Before each refine, the statistics it reads are reduced over the ranks: the 2D-mean gradient sums and
   the visibility counts are summed, the largest screen radii maxed. Every rank then decides on the same
   numbers, as if one GPU had seen all the ranks' views.
2. The random draws of a refine (where split splats land) come from a generator seeded by the run's seed
   and the step, the same on every rank and independent of what the ranks drew before.
3. After every refine the ranks compare their splat counts; a mismatch stops training with an error
   instead of drifting silently.
4. The per-step statistics update needs no host sync (gsplat's indexes by a boolean mask, which makes the
   host wait for the GPU every step); it gives the same numbers. It runs inside the training step, right after
   backward (`accumulate`), not in the after-iteration callback, so the step graph (step_graph.py) records it
   with the rest of the step; `step_post_backward` then only refines and resets.
5. A refine keeps PyTorch's cache of freed device memory: gsplat's `step_post_backward` empties it after every
   refine (`torch.cuda.empty_cache()`), which frees the cached blocks with a wait for the GPU and leaves the
   next step (and the step graph's next recording) to allocate them from the driver again. PyTorch empties the
   cache by itself when an allocation would otherwise fail, so keeping it costs no usable memory.
The reduction and the check are the only collectives, and they run at refine steps only. With one process
(no process group) points 1 and 3 do not apply.

The hooks are DefaultStrategy's `_grow_gs` and `_prune_gs` (gsplat 1.4.0), which `step_post_backward` runs in that
order at each refine step, before the statistics are reset; it follows gsplat 1.4.0's schedule (when to refine,
when to reset opacities) but for point 5.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from gsplat.strategy import DefaultStrategy
from gsplat.strategy.ops import reset_opa


class SplatCountMismatchError(RuntimeError):
    """Ranks hold different numbers of splats after a refine."""


@dataclass
class ByteSplatStrategy(DefaultStrategy):
    seed: int = 42
    """Seeds each refine's random draws (with the step)."""
    distributed: bool = False
    """Reduce the statistics over the default process group and check splat counts after each refine."""
    _scales: dict = field(default_factory=dict, repr=False)
    """(width, height, cameras, device) -> the [2] gradient scale on the device, made once (each new_tensor would
    be a copy from host memory that waits for the GPU)."""

    @torch.no_grad()
    def accumulate(self, params, state: dict, info: dict, step: int) -> None:
        """This step's densification statistics (2D-mean gradient norms, visibility counts, screen radii), added
        right after backward while they are still gathered (step < refine_stop_iter): gsplat's update, with masks
        instead of boolean indexing (no host sync), in place (the step graph keeps the tensors)."""
        if step >= self.refine_stop_iter:
            return
        means2d = info[self.key_for_gradient]
        grads = means2d.absgrad if self.absgrad else means2d.grad  # [C, N, 2]
        key = (info["width"], info["height"], info["n_cameras"], grads.device)
        if key not in self._scales:
            self._scales[key] = grads.new_tensor([key[0] / 2.0 * key[2], key[1] / 2.0 * key[2]])
        scale = self._scales[key]
        visible = info["radii"] > 0.0  # [C, N]
        n = len(params["means"])
        for key in ("grad2d", "count") + (("radii",) if self.refine_scale2d_stop_iter > 0 else ()):
            if state[key] is None:
                state[key] = torch.zeros(n, device=grads.device)
        state["grad2d"] += torch.where(visible, (grads * scale).norm(dim=-1), 0.0).sum(dim=0)
        state["count"] += visible.sum(dim=0)
        if self.refine_scale2d_stop_iter > 0:
            screen = info["radii"] / float(max(info["width"], info["height"]))
            torch.maximum(state["radii"], torch.where(visible, screen, 0.0).amax(dim=0), out=state["radii"])

    def edits_splats_at(self, step: int) -> bool:
        """Whether `step_post_backward` refines or lowers the opacities at `step`."""
        return step < self.refine_stop_iter and (self._refines_at(step) or step % self.reset_every == 0)

    def _refines_at(self, step: int) -> bool:
        refining = step > self.refine_start_iter and step % self.refine_every == 0
        return refining and step % self.reset_every >= self.pause_refine_after_reset

    @torch.no_grad()
    def step_post_backward(self, params, optimizers, state: dict, step: int, info: dict, packed: bool = False) -> None:
        """At refine steps: grow, prune, reset the statistics; every `reset_every` steps: lower the opacities.
        gsplat's schedule and operations; the statistics came in with the step (`accumulate`)."""
        if step >= self.refine_stop_iter:
            return
        if self._refines_at(step):
            n_dupli, n_split = self._grow_gs(params, optimizers, state, step)
            n_prune = self._prune_gs(params, optimizers, state, step)
            if self.verbose:
                print(f"Step {step}: {n_dupli} GSs duplicated, {n_split} GSs split, {n_prune} GSs pruned. "
                      f"Now having {len(params['means'])} GSs.")  # fmt: skip
            for key in ("grad2d", "count") + (("radii",) if self.refine_scale2d_stop_iter > 0 else ()):
                state[key].zero_()
        if step % self.reset_every == 0:
            reset_opa(params=params, optimizers=optimizers, state=state, value=self.prune_opa * 2.0)

    @torch.no_grad()
    def _grow_gs(self, params, optimizers, state, step):
        if self.distributed:
            reduce_statistics(state)
        devices = [params["means"].device] if params["means"].is_cuda else []
        with torch.random.fork_rng(devices=devices):
            torch.manual_seed(self.seed * 1_000_003 + step)
            return super()._grow_gs(params, optimizers, state, step)

    @torch.no_grad()
    def _prune_gs(self, params, optimizers, state, step):
        pruned = super()._prune_gs(params, optimizers, state, step)
        if self.distributed:
            check_equal_counts(len(params["means"]), step)
        return pruned


def reduce_statistics(state: dict) -> None:
    """Sum grad2d and count, max radii, over all ranks (in place)."""
    summed = torch.stack([state["grad2d"], state["count"]])  # [2, N]
    dist.all_reduce(summed)
    state["grad2d"].copy_(summed[0])
    state["count"].copy_(summed[1])
    if state.get("radii") is not None:
        dist.all_reduce(state["radii"], op=dist.ReduceOp.MAX)


def gather_counts(count: int) -> list[int]:
    """Every rank's splat count, in rank order (one host sync)."""
    counts: list = [None] * dist.get_world_size()
    dist.all_gather_object(counts, count)
    return counts


def check_equal_counts(count: int, step: int) -> None:
    """Raise SplatCountMismatchError unless every rank holds `count` splats."""
    counts = gather_counts(count)
    if len(set(counts)) > 1:
        raise SplatCountMismatchError(
            f"After the refine at step {step} the ranks hold different splat counts {counts}; their splats have "
            "diverged. This is a bug: please report it with the command you ran."
        )
