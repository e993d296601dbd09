// Fused forward + backward rasterization: one launch per tile composites front to back, forms each pixel's
// loss gradient on-chip, then runs the backward pass back to front over the same shared-memory splats and
// reduces the per-splat gradients across the tile before one atomicAdd per splat and quantity. Where the pixel
// gradients need the whole image first (the D-SSIM term, autograd), the forward kernel has composited already:
// then the kernel resumes from the state it kept (PassState) and runs the backward pass alone.
#pragma once

#include <cuda_runtime_api.h>

#include "raster_types.h"

namespace bytesplat {

// Where each pixel's gradient comes from: external (autograd) when gt is null, else the in-kernel loss.
struct PixelGradSource {
  const float* v_render;    // [H, W, CDIM] dL/d render (external mode)
  const float* v_alpha;     // [H, W] dL/d alpha, or null (external mode)
  const float* gt;          // [H, W, 3] target (loss mode, CDIM == 3)
  const float* v_extra;     // [H, W, 3] added to dL/d pred, or null (e.g. the D-SSIM term's gradient)
  const float* background;  // [3] pred = render + (1 - alpha) * background, or null (black)
  float w_l1;               // weight of mean |pred - gt| over the H*W*3 values
  float w_l2;               // weight of mean (pred - gt)^2
  float inv_count;          // 1 / (H * W * 3)
  bool clamp;               // pred clamped to [0, 1] before the loss (as the model does)
  float* loss;              // [1] += w_l1 * L1 + w_l2 * L2 (loss mode)
};

struct FusedParams {
  SplatInputs splats;
  TileLists tiles;
  int width;
  int height;
  int capacity;  // splats per on-chip chunk: a tile with more is processed in chunks (reloaded for backward)
  PixelGradSource src;
  float* render;  // [H, W, CDIM] or null
  float* alpha;   // [H, W] or null
  SplatGrads grads;
  PassState resume;  // the forward kernel's state: the backward starts from it instead of compositing (all null: not)
};

// Dynamic shared memory of the fused kernel on tiles of `tile_size` pixels for `capacity` splats per chunk; 0 for
// a side the kernel is not built for.
size_t fused_smem_bytes(int tile_size, int cdim, int capacity);

// Splats per chunk that fit the shared memory of one block on tiles of `tile_size` pixels when `blocks_per_sm`
// blocks share an SM of `device` (read at run time: cudaDevAttrMaxSharedMemoryPerBlockOptin / PerMultiprocessor);
// -1 for a tile side the kernel is not built for or a failed device query.
int fused_tile_capacity(int tile_size, int cdim, int blocks_per_sm, int device);

cudaError_t launch_rasterize_fused(const FusedParams& p, int cdim, cudaStream_t stream);

}  // namespace bytesplat

#ifndef __CUDACC__
#include "common.h"

namespace bytesplat {

// `resume`, in both modes: empty, or the forward kernel's kept state [render, transmittance, last, bits]
// (rasterize_forward with keep_state, on the same splats and tile lists; the external mode reads no render, which
// may be empty there); then the kernel composites nothing.

// External mode (autograd backward). -> [v_means2d [N, 2], v_means2d_abs [N, 2] (empty unless absgrad),
// v_conics [N, 3], v_colors [N, D], v_opacities [N]].
std::vector<at::Tensor> rasterize_backward(const at::Tensor& means2d,      // [N, 2]
                                           const at::Tensor& conics,       // [N, 3]
                                           const at::Tensor& colors,       // [N, D]
                                           const at::Tensor& opacities,    // [N]
                                           const at::Tensor& tile_start,   // [T] int32
                                           const at::Tensor& tile_end,     // [T] int32
                                           const at::Tensor& flatten_ids,  // [M] int32
                                           int64_t width, int64_t height, int64_t tiles_x, int64_t tile_size,
                                           int64_t capacity,
                                           const at::Tensor& v_render,                // [H, W, D]
                                           const c10::optional<at::Tensor>& v_alpha,  // [H, W, 1]
                                           const std::vector<at::Tensor>& resume, bool absgrad);

// Loss mode. -> [loss [1], v_means2d, v_means2d_abs, v_conics, v_colors, v_opacities, render [H, W, 3],
// alpha [H, W, 1]] (render and alpha empty unless want_image, which resuming excludes; poison fills them with NaN
// first).
std::vector<at::Tensor> rasterize_loss(const at::Tensor& means2d,      // [N, 2]
                                       const at::Tensor& conics,       // [N, 3]
                                       const at::Tensor& colors,       // [N, 3]
                                       const at::Tensor& opacities,    // [N]
                                       const at::Tensor& tile_start,   // [T] int32
                                       const at::Tensor& tile_end,     // [T] int32
                                       const at::Tensor& flatten_ids,  // [M] int32
                                       int64_t width, int64_t height, int64_t tiles_x, int64_t tile_size,
                                       int64_t capacity,
                                       const at::Tensor& gt,                          // [H, W, 3]
                                       const c10::optional<at::Tensor>& v_extra,      // [H, W, 3]
                                       const c10::optional<at::Tensor>& background,   // [3]
                                       const std::vector<at::Tensor>& resume, double w_l1, double w_l2,
                                       bool clamp, bool want_image, bool absgrad, bool poison);

// Splats per tile the fused kernel holds on-chip on tiles of `tile_size` pixels, `blocks_per_sm` blocks per SM.
int64_t fused_capacity(int64_t cdim, int64_t tile_size, int64_t blocks_per_sm);

}  // namespace bytesplat
#endif
