// Colour from real spherical harmonics (degrees 0-3, the sign convention of 3DGS and gsplat) for every splat, as
// render/sh.py's sh_to_rgb: rgb = max(sum_k basis_k(d / |d|) coeffs_k + 0.5, 0), in one launch forward and one
// backward. They run on the current stream, so a CUDA graph records them (gsplat 1.4.0's SH kernels launch on the
// legacy default stream, which a recording does not capture); in place of render/sh.py's some 160 small kernels.
//
// forward:  one thread per splat: normalise its direction, evaluate the (degree + 1)^2 bases, the dot product per
//           channel, +0.5, clamp at 0.
// backward: one thread per splat recomputes the forward's bases and sums, then writes
//           dL/dcoeffs_k = basis_k * g (zero for bases past the degree) and dL/d dirs through the bases'
//           derivatives and the normalisation, where g = dL/drgb where the unclamped sum is >= 0, else 0 (torch's
//           clamp_min gradient).
// The coefficients come in two arrays, as the model keeps them (features_dc and features_rest), so that nothing joins
// them before the forward or splits their gradient after the backward. Both kernels move each warp's coefficient
// rows through shared memory, so that device memory sees whole rows (sh.cu).
// Given the projection's screen radii, a splat of radius 0 (culled: no tile composites it, so dL/drgb is 0 there) is
// neither read nor evaluated: colour 0, gradients 0, as gsplat's SH kernels with their mask. A room seen from inside
// has a fifth of its splats in a view.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace bytesplat {

constexpr int kShMaxDegree = 3;

struct ShParams {
  const float* dc;    // [N, 3] each splat's first coefficient
  const float* rest;  // [N, K - 1, 3] the others (unread when K == 1)
  const float* dirs;  // [N, 3], any length
  int64_t n;
  int k;                // coefficients per splat, (degree + 1)^2 <= K <= 16
  int degree;
  const int32_t* radii;  // [N] screen radii (0: culled, skipped), or nullptr: every splat evaluated
};

cudaError_t launch_sh_forward(const ShParams& p, float* rgb, cudaStream_t stream);
cudaError_t launch_sh_backward(const ShParams& p, const float* v_rgb, float* v_dc, float* v_rest, float* v_dirs,
                               cudaStream_t stream);

}  // namespace bytesplat

#ifndef __CUDACC__
#include "common.h"

namespace bytesplat {

// -> rgb [N, 3]. dc [N, 3], rest [N, K - 1, 3] and dirs [N, 3], float32 contiguous on one CUDA device; radii [N]
// int32 or None.
at::Tensor sh_forward(int64_t degree, const at::Tensor& dc, const at::Tensor& rest, const at::Tensor& dirs,
                      bool poison, const std::optional<at::Tensor>& radii);

// -> (dL/ddc [N, 3], dL/drest [N, K - 1, 3], dL/ddirs [N, 3]) from dL/drgb [N, 3].
std::tuple<at::Tensor, at::Tensor, at::Tensor> sh_backward(int64_t degree, const at::Tensor& dc, const at::Tensor& rest,
                                                           const at::Tensor& dirs, const at::Tensor& v_rgb,
                                                           bool poison, const std::optional<at::Tensor>& radii);

}  // namespace bytesplat
#endif
