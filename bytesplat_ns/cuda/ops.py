"""Thin Python wrappers around the fused kernels (csrc/), and the autograd Functions over them.

Layout as gsplat's `_wrapper.py`: checks and reshaping here, the Functions only make inputs contiguous, call
the kernel and save what backward needs. All tensors are float32 on one CUDA device; N splats, T tiles of
16x16 pixels (8x8 for smaller images: `tile_size_for`), M tile entries.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
from torch import Tensor

from bytesplat_ns.cuda import build

TILE_SIZE = 16
"""Tile side in pixels of the kernels by default: one block of 16x16 threads per tile, one pixel each."""
SMALL_TILE_SIZE = 8
"""Tile side for images with fewer 16-pixel tiles than two waves of blocks (`tile_size_for`): blocks of 8x8 threads."""
BLOCKS_PER_SM = 4
"""Fused-kernel blocks meant to share one SM: each gets 1/BLOCKS_PER_SM of the SM's shared memory, for either tile
side. For 16-pixel tiles 4 is what the kernel's register budget allows (kMinBlocksPerSm<16> in
csrc/rasterize_fused.cu: keep the two equal); on the H200 it ran faster than 2 or 3 on both benchmark scenes
(benchmarks/RESULTS.md, sixth session). More would only shrink the capacity: registers keep at most 4 blocks on an
SM. 8-pixel tiles get the same share per block (more splats fit: their blocks' fixed part is smaller)."""
PEER_FLAG_BYTES = 256
"""A peer region's leading bytes, the barrier's flags (kPeerFlagBytes in csrc/peer_memory.h): rows start after them."""
PEER_CHANNELS = 4
"""Barriers that can be told apart in a peer region's flags (kPeerChannels in csrc/peer_memory.h)."""
PEER_RANKS = 8
"""The most ranks that read each other's regions (kMaxPeerRanks in csrc/peer_memory.h)."""
SMALL_TILE_WAVES = 2
"""`tile_size_for` takes 8-pixel tiles for images with fewer 16-pixel tiles than this many waves of fused-kernel
blocks (SMs x BLOCKS_PER_SM)."""


@dataclass
class TileLists:
    """Each tile's splats, front to back: entries ids[start[t]:end[t]] of tile t (row-major tiles)."""

    start: Tensor  # [T] int32
    end: Tensor  # [T] int32 (after pruning)
    ids: Tensor  # [M] int32 splat index per entry
    tiles_x: int
    tiles_y: int
    pruned: Tensor  # [1] int32 entries dropped by on-chip pruning (stays on the device: no sync)
    tile_size: int  # tile side in pixels, TILE_SIZE or SMALL_TILE_SIZE


@dataclass
class ForwardState:
    """What the forward kernel keeps for a backward that resumes from it instead of compositing each tile again
    (csrc/raster_types.h, PassState): valid for the splats and tile lists it rendered."""

    render: Tensor  # [H, W, D] premultiplied colour, no background
    transmittance: Tensor  # [H, W] final transmittance
    last: Tensor  # [H, W] int32 index in its tile's list of the last splat composited into the pixel (-1: none)
    bits: Tensor  # [words] int32: per tile, warp and list entry, whether a pixel of the warp composited it

    def tensors(self) -> list[Tensor]:
        return [self.render, self.transmittance, self.last, self.bits]


@dataclass
class LossWeights:
    """The per-pixel loss the fused kernel forms on-chip: l1 * mean|pred - gt| + l2 * mean (pred - gt)^2."""

    l1: float = 0.8
    l2: float = 0.0
    clamp: bool = True
    """pred = clamp(render + (1 - alpha) * background, 0, 1), as the model clamps before its loss."""


def ext():
    return build.load()


def _index(device: torch.device) -> int:
    return device.index if device.index is not None else torch.cuda.current_device()


@functools.cache
def _capacity(device_index: int, channels: int, tile_size: int, blocks_per_sm: int) -> int:
    with torch.cuda.device(device_index):
        return int(ext().fused_capacity(channels, tile_size, blocks_per_sm))


def tile_capacity(device: torch.device, channels: int, tile_size: int, blocks_per_sm: int = BLOCKS_PER_SM) -> int:
    """Splats per tile of `tile_size` pixels that the fused kernel holds on-chip, from the device's shared memory
    (read at run time) when `blocks_per_sm` blocks share an SM. Larger for 8-pixel tiles than for 16: the same
    shared memory per block, less of it fixed (BLOCKS_PER_SM)."""
    return _capacity(_index(device), channels, tile_size, blocks_per_sm)


@functools.cache
def sm_count(device_index: int) -> int:
    """Streaming multiprocessors of a CUDA device (132 on the H200)."""
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def tile_size_for(width: int, height: int, device: torch.device) -> int:
    """The tile side the kernels use for a width x height image on `device`: SMALL_TILE_SIZE (8) when the image has
    fewer 16-pixel tiles, ceil(w/16) ceil(h/16), than SMALL_TILE_WAVES waves of blocks (SMs x BLOCKS_PER_SM: 1056
    on the H200's 132 SMs), else TILE_SIZE (16).

    Why: the kernels run one block per tile, each walking its tile's list of splats, and a step lasts as long as
    its slowest blocks. With few tiles the tiles holding the object's middle have the longest lists and most SMs
    wait for them; 8-pixel tiles cut each such list four ways (a tile's list holds the splats that reach it, and a
    smaller tile is reached by fewer). On the H200, lego-400 trained at 1.80 ms per step with 8-pixel tiles at
    every resolution (its 100x100, 200x200 and 400x400 images have 49, 169 and 625 16-pixel tiles) against 2.18 ms
    with 8-pixel tiles below 132 tiles only (benchmarks/RESULTS.md, thirteenth session). With many tiles every
    SM has work, and 16-pixel tiles cost less: a block loads each splat once for 256 pixels instead of 64, and a
    splat enters fewer lists; on the kernel benchmark's 800x800 (2500 tiles) and 1920x1080 (8160 tiles) scenes the
    fused step took 1.42 and 4.82 ms with 16-pixel tiles, 1.90 and 7.81 ms with 8-pixel ones.

    The choice depends on the image size only (and the device), so a training step at a given resolution always
    uses the same side (step_graph.py relies on that)."""
    tiles = -(-width // TILE_SIZE) * -(-height // TILE_SIZE)
    return SMALL_TILE_SIZE if tiles < SMALL_TILE_WAVES * BLOCKS_PER_SM * sm_count(_index(device)) else TILE_SIZE


@dataclass
class TileEntries:
    """Sorted (splat, tile) entries from `bin_tiles`, in buffers that may hold more entries than are used."""

    ids: Tensor  # [C] int32 splat index per entry, grouped by tile, front to back within a tile
    offsets: Tensor  # [T] int32 first entry of each tile (gsplat's isect offsets)
    kept: Tensor  # [1] int32 entries in use: min(total, C)
    total: Tensor  # [1] int64 entries the splats make (more than C when the capacity overflowed)
    tiles_x: int
    tiles_y: int
    tile_size: int  # tile side in pixels, TILE_SIZE or SMALL_TILE_SIZE


def bin_tiles(
    means2d: Tensor,  # [N, 2]
    radii: Tensor,  # [N] int32
    depths: Tensor,  # [N]
    tiles_x: int,
    tiles_y: int,
    tile_size: int,
    capacity: int,
) -> TileEntries:
    """gsplat's tile binning (isect_tiles + isect_offset_encode, one camera) on tiles of `tile_size` pixels into
    buffers of `capacity` entries, without a host sync; capacity < 0: the exact count (one host read). See
    csrc/bin_tiles.h."""
    _, ids, offsets, kept, total = ext().bin_tiles(
        means2d.detach().contiguous(), radii.to(torch.int32).contiguous(), depths.detach().contiguous(), tiles_x,
        tiles_y, tile_size, capacity,
    )  # fmt: skip
    return TileEntries(
        ids=ids, offsets=offsets, kept=kept, total=total, tiles_x=tiles_x, tiles_y=tiles_y, tile_size=tile_size
    )


def tile_lists(
    bins: TileEntries,  # its ids are rewritten in place where a tile is pruned
    means2d: Tensor,  # [N, 2]
    conics: Tensor,  # [N, 3]
    opacities: Tensor,  # [N]
    capacity: int | None,
) -> TileLists:
    """Tile ranges from the binning; with a capacity (tile_capacity of the binning's tile side), tiles with more
    entries keep only the `capacity` splats that contribute most there (criterion in csrc/prune_tiles.h), in depth
    order."""
    end, pruned = ext().tile_ranges(
        bins.offsets, bins.ids, means2d.detach().contiguous(), conics.detach().contiguous(),
        opacities.detach().contiguous(), bins.kept, bins.tiles_x, bins.tile_size, capacity or 0,
    )  # fmt: skip
    return TileLists(
        start=bins.offsets, end=end, ids=bins.ids, tiles_x=bins.tiles_x, tiles_y=bins.tiles_y, pruned=pruned,
        tile_size=bins.tile_size,
    )  # fmt: skip


def rasterize_pixels(
    means2d: Tensor,  # [1, N, 2] or [N, 2]; receives .absgrad [same shape] after backward when absgrad
    conics: Tensor,  # [N, 3]
    colors: Tensor,  # [N, D], D = 3 or 4
    opacities: Tensor,  # [N]
    tiles: TileLists,
    width: int,
    height: int,
    capacity: int,  # splats per on-chip chunk, at most tile_capacity(device, D, tiles.tile_size)
    absgrad: bool = False,
    poison: bool = False,
) -> tuple[Tensor, Tensor]:
    """Differentiable compositing: -> render [H, W, D] (premultiplied, no background), alpha [H, W, 1].
    The backward pass is the fused kernel fed with dL/d render and dL/d alpha, resuming from the state the forward
    kept (ForwardState): it composites nothing again."""
    _check(means2d, conics, colors, opacities, tiles, width, height)
    return _Rasterize.apply(means2d, conics, colors, opacities, tiles, width, height, capacity, absgrad, poison)


def render_pixels(
    means2d: Tensor, conics: Tensor, colors: Tensor, opacities: Tensor, tiles: TileLists, width: int, height: int,
    keep: bool = False, poison: bool = False,
) -> tuple[Tensor, Tensor, ForwardState | None]:  # fmt: skip
    """Forward only, no autograd: render [H, W, D], alpha [H, W, 1], and with `keep` the state a backward resumes
    from (loss_pixels(resume=...)), else None."""
    _check(means2d, conics, colors, opacities, tiles, width, height)
    with torch.no_grad():
        return _forward(_flat(means2d, conics, colors, opacities), tiles, width, height, keep, poison)


def _forward(
    flat: tuple[Tensor, ...], tiles: TileLists, width: int, height: int, keep: bool, poison: bool
) -> tuple[Tensor, Tensor, ForwardState | None]:
    render, alpha, transmittance, last, bits = ext().rasterize_forward(
        *flat, tiles.start, tiles.end, tiles.ids, width, height, tiles.tiles_x, tiles.tile_size, keep, poison
    )
    return render, alpha, ForwardState(render, transmittance, last, bits) if keep else None


def loss_pixels(
    means2d: Tensor,  # [1, N, 2] or [N, 2]
    conics: Tensor,  # [N, 3]
    colors: Tensor,  # [N, 3]
    opacities: Tensor,  # [N]
    tiles: TileLists,
    gt: Tensor,  # [H, W, 3]
    background: Tensor | None,  # [3]
    weights: LossWeights,
    capacity: int,  # splats per on-chip chunk, at most tile_capacity(device, 3, tiles.tile_size)
    v_extra: Tensor | None = None,  # [H, W, 3] extra dL/d pred (the D-SSIM term's gradient)
    extra_loss: Tensor | None = None,  # [] the value of the loss whose gradient v_extra is
    absgrad: bool = False,
    want_image: bool = False,
    resume: ForwardState | None = None,
    poison: bool = False,
) -> tuple[Tensor, Tensor | None, Tensor | None]:
    """Fused forward + loss + backward in one launch. -> loss [] (differentiable: its backward hands out the
    gradients computed here, scaled), render [H, W, 3] and alpha [H, W, 1] (None unless want_image). With `resume`
    (render_pixels(keep=True) of the same splats and tiles, e.g. for v_extra) the kernel composites nothing again:
    it runs the loss and the backward pass from that state (want_image must then be False)."""
    height, width = gt.shape[:2]
    _check(means2d, conics, colors, opacities, tiles, width, height)
    if colors.shape[-1] != 3:
        raise ValueError(f"The fused loss takes RGB colours [N, 3], got {tuple(colors.shape)}.")
    if want_image and resume is not None:
        raise ValueError("loss_pixels(): want_image with resume; the resumed forward's render is resume.render.")
    extra = extra_loss.detach().reshape(()) if extra_loss is not None else None
    loss, render, alpha = _FusedLoss.apply(
        means2d, conics, colors, opacities, tiles, gt, background, weights, capacity, v_extra, extra, absgrad,
        want_image, resume, poison,
    )  # fmt: skip
    return loss, (render if want_image else None), (alpha if want_image else None)


def _flat(means2d: Tensor, conics: Tensor, colors: Tensor, opacities: Tensor) -> tuple[Tensor, ...]:
    n = means2d.shape[-2]
    return (
        means2d.detach().reshape(n, 2).contiguous(), conics.detach().reshape(n, 3).contiguous(),
        colors.detach().reshape(n, -1).contiguous(), opacities.detach().reshape(n).contiguous(),
    )  # fmt: skip


def _check(means2d, conics, colors, opacities, tiles: TileLists, width: int, height: int) -> None:
    n = means2d.shape[-2]
    for name, t in (("means2d", means2d), ("conics", conics), ("colors", colors), ("opacities", opacities)):
        if not t.is_cuda or t.dtype != torch.float32:
            raise ValueError(f"fused rasterizer: {name} must be float32 on CUDA, got {t.dtype} on {t.device}.")
        if t.numel() // max(n, 1) * n != t.numel():
            raise ValueError(f"fused rasterizer: {name} has shape {tuple(t.shape)}, not N={n} rows.")
    if tiles.tile_size not in (TILE_SIZE, SMALL_TILE_SIZE):
        raise ValueError(
            f"fused rasterizer: tiles of {tiles.tile_size} pixels; the kernels take {TILE_SIZE} or {SMALL_TILE_SIZE} "
            "(tile_size_for picks one for an image size)."
        )
    side = tiles.tile_size
    if (tiles.tiles_x, tiles.tiles_y) != (-(-width // side), -(-height // side)):
        raise ValueError(
            f"fused rasterizer: {tiles.tiles_x}x{tiles.tiles_y} tiles of {side} pixels do not cover {width}x{height}."
        )


def _set_absgrad(means2d: Tensor, v_abs: Tensor) -> None:
    means2d.absgrad = v_abs.reshape(means2d.shape)  # read by gsplat's DefaultStrategy (absgrad=True)


class _Rasterize(torch.autograd.Function):
    @staticmethod
    def forward(ctx, means2d, conics, colors, opacities, tiles, width, height, capacity, absgrad, poison):
        flat = _flat(means2d, conics, colors, opacities)
        keep = any(ctx.needs_input_grad[:4])  # the backward resumes from the forward's state
        render, alpha, state = _forward(flat, tiles, width, height, keep, poison)
        ctx.save_for_backward(means2d, *flat[1:], *(state.tensors()[1:] if keep else []))
        ctx.tiles, ctx.size, ctx.capacity, ctx.absgrad = tiles, (width, height), capacity, absgrad
        ctx.shapes = (conics.shape, colors.shape, opacities.shape)
        return render, alpha

    @staticmethod
    def backward(ctx, v_render, v_alpha):
        means2d, conics, colors, opacities, *kept = ctx.saved_tensors  # kept: transmittance, last, bits
        tiles, (width, height) = ctx.tiles, ctx.size
        resume = [v_render.new_empty(0), *kept] if kept else []  # no render: read by the loss mode only
        v_means2d, v_abs, v_conics, v_colors, v_opacities = ext().rasterize_backward(
            means2d.detach().reshape(-1, 2).contiguous(), conics, colors, opacities, tiles.start, tiles.end,
            tiles.ids, width, height, tiles.tiles_x, tiles.tile_size, ctx.capacity, v_render.contiguous(),
            v_alpha.contiguous(), resume, ctx.absgrad,
        )  # fmt: skip
        if ctx.absgrad:
            _set_absgrad(means2d, v_abs)
        grads = [g.reshape(shape) for g, shape in zip((v_conics, v_colors, v_opacities), ctx.shapes)]
        return v_means2d.reshape(means2d.shape), *grads, None, None, None, None, None, None


class _FusedLoss(torch.autograd.Function):
    """The loss is computed with its gradients (one kernel, in forward); backward scales them by the loss's incoming
    gradient in place (csrc/scale_grads.h: nothing read or written when it is 1) and hands them out, once."""

    @staticmethod
    def forward(
        ctx, means2d, conics, colors, opacities, tiles, gt, background, weights, capacity, v_extra, extra,
        absgrad, want_image, resume, poison,
    ):  # fmt: skip
        height, width = gt.shape[:2]
        loss, *grads, render, alpha = ext().rasterize_loss(
            *_flat(means2d, conics, colors, opacities), tiles.start, tiles.end, tiles.ids, width, height,
            tiles.tiles_x, tiles.tile_size, capacity, gt.detach().contiguous(),
            None if v_extra is None else v_extra.detach().contiguous(),
            None if background is None else background.detach().to(torch.float32).contiguous(),
            [] if resume is None else resume.tensors(), weights.l1, weights.l2, weights.clamp, want_image, absgrad,
            poison,
        )  # fmt: skip
        ctx.save_for_backward(means2d)
        ctx.grads = grads  # v_means2d, v_abs, v_conics, v_colors, v_opacities: not inputs or outputs
        ctx.absgrad = absgrad
        ctx.shapes = (conics.shape, colors.shape, opacities.shape)
        ctx.mark_non_differentiable(render, alpha)
        loss = loss.reshape(())
        return (loss if extra is None else loss + extra), render, alpha

    @staticmethod
    def backward(ctx, v_loss, _v_render, _v_alpha):
        (means2d,) = ctx.saved_tensors
        if ctx.grads is None:
            raise RuntimeError(
                "The fused loss hands out its gradients once (its backward scales them in place); backpropagate it "
                "once per forward (no retain_graph), or build the loss in torch over ops.rasterize_pixels."
            )
        (v_means2d, v_abs, *grads), ctx.grads = ctx.grads, None
        # v_loss: [] float32 on the loss's device (autograd casts it to the loss's dtype), read by the kernel as is
        ext().scale_grads([v_means2d, *grads], [v_abs] if ctx.absgrad else [], v_loss)
        if ctx.absgrad:
            _set_absgrad(means2d, v_abs)
        grads = [g.reshape(shape) for g, shape in zip(grads, ctx.shapes)]
        return v_means2d.reshape(means2d.shape), *grads, *[None] * 11  # tiles .. poison


def pack_rows(
    grads: list[Tensor],  # each [N, ...] float32, contiguous; zeroed with `clear`
    capacity: int,
    note: int,
    half: bool,
    residual: Tensor | None = None,  # [N, D] read and written: rows held earlier, then the rows past capacity
    residual_rows: Tensor | None = None,  # [1] int32 read and written: how many rows `residual` holds
    owners: int = 1,
    index_scale: int = 1,
    index_offset: int = 0,
    visible: Tensor | None = None,  # [N] int32 (a render's screen radii): rows where it is 0 hold zeros
    clear: bool = False,
    own_scale: float = 0.0,
    out: Tensor | None = None,  # [owners, capacity + 1, slots + D] to write the buffers into
    send_in_view: bool = False,
) -> Tensor:
    """The compacted exchange's buffers [owners, capacity + 1, slots + D] (csrc/sparse_rows.h), row i in buffer
    i mod owners: a header row (row count, note, 0), then the rows with a non-zero value, in no particular order,
    each its int32 index (i * index_scale + index_offset) then its values. The rows `residual` holds are added in
    (it is read only when `residual_rows` is not 0), the rows past the capacity held there instead, and
    `residual_rows` set to their count. The rows where `visible` is 0 are not read (the caller's word that they hold
    zeros; ignored while the residual holds rows). `clear`: `grads` are all zeros afterwards; with `own_scale`
    (not 0), but for the rows sent, which hold own_scale x their values as the unpack decodes them (this rank's share
    of the sums, for `unpack_rows(..., own_rank=rank)`). `out`: write the buffers there (a rank's slice of the
    all-gather's output) instead of a new tensor. `send_in_view` (with `visible`, one owner, no residual): where
    the rows in view are read alone, every one of them is sent, zeros included, in row order (the count is the rows
    in view), which the kernel does without a test of each row or an atomic."""
    return ext().pack_rows(grads, residual, residual_rows, visible, out, capacity, note, half, owners, index_scale,
                           index_offset, clear, own_scale, send_in_view)  # fmt: skip


def unpack_rows(
    grads: list[Tensor],  # each [N, ...] float32, contiguous; overwritten
    gathered: Tensor | list[Tensor],  # [W, capacity + 1, slots + D], or W of [capacity + 1, slots + D]: every
    capacity: int,  # rank's buffer from pack_rows (an all-gather's output, or peers' regions: peer_rows.py)
    scale: float,
    index_divisor: int = 1,
    zeroed: bool = False,
    own_rank: int = -1,
) -> Tensor:
    """grads = scale * the sum of every rank's rows, each added at row index // index_divisor, in rank order
    (bitwise the same on every rank), in one call; `zeroed`: the caller's word that grads hold zeros already (a
    pack with `clear` left them so), which spares a pass zeroing them; `own_rank` (>= 0): they hold that rank's
    rows already (a pack with `own_scale` = scale left them so), and the other ranks' rows are added to them (with
    two ranks, a + b on one and b + a on the other: the same bits). -> the ranks' header rows [W, 3] int32 (row
    count, note, third value)."""
    buffers = list(gathered.unbind(0)) if isinstance(gathered, Tensor) else gathered
    return ext().unpack_rows(grads, buffers, capacity, scale, index_divisor, zeroed, own_rank)


def peer_region(num_bytes: int, device: torch.device) -> Tensor:
    """-> [num_bytes] uint8: device memory of its own allocation that other processes can map (CUDA IPC), its first
    PEER_FLAG_BYTES the barrier's flags (zeroed), then room for rows (csrc/peer_memory.h)."""
    return ext().peer_region(num_bytes, _index(device))


def peer_handle(region: Tensor) -> Tensor:
    """-> [64] uint8 on the CPU: the IPC handle of a `peer_region`, for the other processes."""
    return ext().peer_handle(region)


def open_peer_region(handle: Tensor, num_bytes: int, device: torch.device) -> Tensor:
    """-> [num_bytes] uint8 on `device`: another process's `peer_region`, mapped from its handle."""
    return ext().open_peer_region(handle, num_bytes, _index(device))


def peer_barrier(
    regions: list[Tensor],  # every rank's region as mapped here, in rank order
    counter: Tensor,  # [PEER_CHANNELS] int32 on this rank's device: its epochs, zeroed with the regions
    channel: int,
    rank: int,
    timeout_s: float,
) -> None:
    """Every rank waits, on the GPU (the current stream), until every other has reached this barrier on `channel`,
    what each wrote before it visible to the others; graph-replayable. A rank that has not arrived after
    `timeout_s` fails the kernel with a message."""
    ext().peer_barrier(regions, counter, channel, rank, timeout_s)


def ssim(
    x: Tensor,  # [H, W, C] float32, H and W >= 11; no gradient
    y: Tensor,  # [H, W, C] float32
    poison: bool = False,
) -> Tensor:
    """pytorch_msssim's ssim(x, y, data_range=1) of the [1, C, H, W] views, differentiable w.r.t. y: one launch
    forward, one backward (csrc/ssim.h). -> []"""
    if x.requires_grad:
        raise ValueError("The SSIM kernel differentiates w.r.t. its second image only; detach the first.")
    return _SSIM.apply(x, y, poison)


class _SSIM(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, y, poison):
        x, y = x.detach().contiguous(), y.detach().contiguous()
        partials, dmaps = ext().ssim_forward(x, y, poison)
        ctx.save_for_backward(x, y, dmaps)
        ctx.count, ctx.poison = dmaps[0].numel(), poison  # channels x valid positions: the mean's divisor
        return partials.sum() / ctx.count

    @staticmethod
    def backward(ctx, v_ssim):
        x, y, dmaps = ctx.saved_tensors
        v_ssim = v_ssim.detach().to(torch.float32).reshape(1).contiguous()
        return None, ext().ssim_backward(x, y, dmaps, v_ssim, 1.0 / ctx.count, ctx.poison), None


def sh_colors(
    degree: int,
    dc: Tensor,  # [N, 3] float32: each splat's first SH coefficient (the model's features_dc)
    rest: Tensor,  # [N, K - 1, 3] float32: the others (features_rest), K >= (degree + 1) ** 2
    dirs: Tensor,  # [N, 3] float32, any length (splat centre minus camera position)
    poison: bool = False,
    radii: Tensor | None = None,  # [N] int32 screen radii: splats of radius 0 are skipped (colour and gradients 0)
) -> Tensor:
    """render/sh.py's sh_to_rgb of the coefficients [dc, rest] in one launch forward and one backward (csrc/sh.h),
    on the current stream, so a CUDA graph records it; the coefficients are read, and their gradients written, in
    the two parts they come in. With `radii`, culled splats (radius 0: no tile composites them) are not read. ->
    [N, 3]"""
    return _ShColors.apply(degree, dc, rest, dirs, poison, radii)


class _ShColors(torch.autograd.Function):
    @staticmethod
    def forward(ctx, degree, dc, rest, dirs, poison, radii):
        dc, rest, dirs = dc.detach().contiguous(), rest.detach().contiguous(), dirs.detach().contiguous()
        radii = radii.contiguous() if radii is not None else None
        ctx.save_for_backward(dc, rest, dirs, radii)
        ctx.degree, ctx.poison = degree, poison
        return ext().sh_forward(degree, dc, rest, dirs, poison, radii)

    @staticmethod
    def backward(ctx, v_rgb):
        dc, rest, dirs, radii = ctx.saved_tensors
        v_dc, v_rest, v_dirs = ext().sh_backward(ctx.degree, dc, rest, dirs, v_rgb.contiguous(), ctx.poison, radii)
        return None, v_dc, v_rest, v_dirs, None, None


def adam_step(
    params: list[Tensor],  # one per group, float32 contiguous; updated in place
    grads: list[Tensor],  # shaped as params
    exp_avgs: list[Tensor],  # shaped as params; updated in place
    exp_avg_sqs: list[Tensor],  # shaped as params; updated in place
    steps: list[Tensor],  # [] float32 each, on the device; each advanced by 1
    lrs: Tensor,  # [G] float32
    betas: list[tuple[float, float]],
    eps: list[float],
    blocks_done: Tensor,  # [1] int32 zeros, kept between calls (the kernel re-arms it)
    visible: Tensor | None = None,  # [N] bool: rows of groups with N rows step only where True
    skip: Tensor | None = None,  # [] bool: True leaves parameters, moments and steps as they are
) -> None:
    """One Adam step (torch's fused arithmetic) of up to 8 parameter groups in one launch (csrc/adam.h)."""
    beta1, beta2 = [b[0] for b in betas], [b[1] for b in betas]
    ext().adam_step(params, grads, exp_avgs, exp_avg_sqs, steps, lrs, beta1, beta2, eps, visible, skip, blocks_done)
