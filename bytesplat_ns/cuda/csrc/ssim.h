// SSIM of two images and its gradient w.r.t. the second, in two launches (bytesplat_ns/ssim.py).
//
// The SSIM is pytorch_msssim's ssim(x, y, data_range=1), splatfacto's: an 11x11 Gaussian window (sigma 1.5) at
// every position where it lies inside the image ("valid" positions, (H - 10) x (W - 10) per channel), constants
// C1 = 0.01^2 and C2 = 0.03^2, the mean over channels and positions. Images are [H, W, C] float32.
//
// forward:  per block of 16x16 positions and one channel, x and y with their 10-pixel halo go to shared memory;
//           the window's five moments (mean x, mean y, E[x^2], E[y^2], E[xy]) come from a pass along rows, then
//           one along columns. SSIM at each position is summed per block into `partials`, and its derivatives
//           w.r.t. mean y, E[y^2] and E[xy] (at fixed mean x and E[x^2]) go to `dmaps` [3, C, H - 10, W - 10].
// backward: mean y, E[y^2] and E[xy] are window sums over y, so dSSIM/dy at pixel p is the window's correlation
//           of the three maps around p, combined as d_mean + 2 y_p d_yy + x_p d_xy; times `scale` and the
//           incoming gradient (a device scalar: no host sync).
#pragma once

#include <cuda_runtime_api.h>

namespace bytesplat {

constexpr int kSsimWindow = 11;
constexpr int kSsimBlock = 16;  // positions per block side

struct SsimParams {
  const float* x;   // [H, W, C]
  const float* y;   // [H, W, C]
  int height;
  int width;
  int channels;
  float window[kSsimWindow];  // the 1D Gaussian, normalised (as pytorch_msssim computes it, in float32)
};

cudaError_t launch_ssim_forward(const SsimParams& p, float* partials, float* dmaps, cudaStream_t stream);
cudaError_t launch_ssim_backward(const SsimParams& p, const float* dmaps, const float* v_ssim, float scale,
                                 float* v_y, cudaStream_t stream);
int ssim_forward_blocks(int height, int width, int channels);

}  // namespace bytesplat

#ifndef __CUDACC__
#include "common.h"

namespace bytesplat {

// -> (partials [blocks]: SSIM summed per block, dmaps [3, C, H - 10, W - 10]).
std::tuple<at::Tensor, at::Tensor> ssim_forward(const at::Tensor& x, const at::Tensor& y, bool poison);

// -> dSSIM_sum/dy [H, W, C] times scale times *v_ssim ([1] float32).
at::Tensor ssim_backward(const at::Tensor& x, const at::Tensor& y, const at::Tensor& dmaps, const at::Tensor& v_ssim,
                         double scale, bool poison);

}  // namespace bytesplat
#endif
