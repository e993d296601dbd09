"""One step late: each step's averaged splat gradients update the splats at the next step, so that their exchange
runs beside the next step's render instead of after its own (--pipeline.exchange-one-step-late True, several GPUs).

With the exchange in its step, a two-GPU step is the render, then the exchange (pack, all-gather, unpack), then
Adam: on a 2M-splat room the exchange added some 1.6 ms to a 4.8 ms step (benchmarks/RESULTS.md, thirty-eighth
session). One step late, a step t
1. starts the exchange of step t - 1's packed rows (all-gather, unpack into `averaged`: the mean over the ranks)
   and the non-finite guard's judgement of them; replayed from the step graph this runs on a side stream, beside 2.;
2. renders its own view and backpropagates into the parameters' gradients;
3. waits for 1., then runs Adam on `averaged` (unless the guard found them bad);
4. packs its own gradient rows for step t + 1 (SparseRowExchange.pack_for_later).
So the splats step t renders have been updated with the gradients up to step t - 2: every gradient is applied one
step later than with the exchange in its step, on every rank alike (the ranks stay identical). What that costs in
held-out PSNR is measured, not assumed: on the CPU's small built-in scene with two ranks, 0.26 dB (benchmarks/
RESULTS.md, forty-first session), so it is off by default.

The packed rows are applied before anything reads or edits the splats as a whole on every rank (the trainer's
`_apply_pending`): before a refine or opacity reset (the rows name splats by their index, which densification
changes), before the training loop writes a checkpoint (a resumed run starts from every gradient applied) and when
training ends. What rank 0 alone does meanwhile (an evaluation, a render in the viewer) sees the splats without the
last step's gradients: applying them takes every rank. After a non-finite restore the packed rows are dropped
(`drop_pending`).

Every step, eager or replayed, makes the same one all-gather on every rank (of an empty buffer after the pending
rows were applied or dropped), so ranks that record their step graphs at different steps stay matched. A step with
no pending rows (the first, and the one after each application or drop) runs op by op and leaves Adam out; so a
replayed step always applies a step's rows.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TypeVar

import torch
from torch import Tensor

from bytesplat_ns.grad_compaction import SparseRowExchange

T = TypeVar("T")


class LateUpdate:
    """The averaged gradients of the step before and whether a step's rows are pending (the module docstring)."""

    def __init__(self, exchange: SparseRowExchange) -> None:
        if not exchange.one_step_late:
            raise ValueError("LateUpdate needs a SparseRowExchange made with one_step_late=True.")
        self.exchange = exchange
        self.pending = False
        """Host: the packed buffer holds a step's rows not yet applied (the same on every rank)."""
        self.averaged: list[Tensor] = []
        """[N, ...] per splat parameter: the mean over the ranks of the rows the last `gather` received."""
        self._side: torch.cuda.Stream | None = None
        self._forked = False

    def prepare(self, params: list[Tensor]) -> None:
        """Host, before each step: `averaged` shaped as `params` (new zeros after densification)."""
        if [a.shape for a in self.averaged] != [p.shape for p in params] or self.averaged[0].device != params[0].device:
            self.averaged = [torch.zeros_like(p) for p in params]
        if self._side is None and params[0].is_cuda:  # made here: not while a recording is under way
            self._side = torch.cuda.Stream(device=params[0].device)

    def key(self) -> tuple:
        """What a recorded step bakes in from here: the addresses of `averaged`."""
        return tuple(a.data_ptr() for a in self.averaged)

    def gather(self, then: Callable[[], T] | None = None) -> T | None:
        """Step 1 (module docstring): the step before's rows into `averaged`, then `then()` (the non-finite guard's
        judgement of them). While the step graph records, on a side stream that the graph runs beside the render
        (`join` waits for it). -> what `then` returned."""
        if not torch.cuda.is_available() or not torch.cuda.is_current_stream_capturing():
            self.exchange.gather_packed(self.averaged)
            return then() if then is not None else None
        self._side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(self._side):
            self.exchange.gather_packed(self.averaged)
            result = then() if then is not None else None
        self._forked = True
        return result

    def join(self) -> None:
        """Wait (on the device) for `gather`'s side stream."""
        if self._forked:
            torch.cuda.current_stream().wait_stream(self._side)
            self._forked = False

    @contextmanager
    def as_gradients(self, params: list[Tensor]) -> Iterator[None]:
        """Within: each of `params`' .grad is its `averaged` (what the guard and Adam read); after: the step's own
        gradients again (what `pack_for_later` reads)."""
        own = [p.grad for p in params]
        for param, averaged in zip(params, self.averaged):
            param.grad = averaged
        try:
            yield
        finally:
            for param, grad in zip(params, own):
                param.grad = grad

    def drop_pending(self) -> None:
        """Forget the packed rows (after a non-finite restore), on every rank alike."""
        self.exchange.mark_packed_sent()
        self.pending = False
