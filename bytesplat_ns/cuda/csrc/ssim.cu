// SSIM forward and backward kernels (ssim.h): one block per 16x16 positions (forward) or pixels (backward) and
// channel; the window's sums are separable, so each is a pass along rows in shared memory, then along columns.
#include "ssim.h"

namespace bytesplat {
namespace {

constexpr int kHalo = kSsimWindow - 1;      // the window reaches this many pixels past a block
constexpr int kSpan = kSsimBlock + kHalo;   // a block's input side, halo included
constexpr int kThreads = kSsimBlock * kSsimBlock;
constexpr int kMoments = 5;                 // mean x, mean y, E[x^2], E[y^2], E[xy]
constexpr int kMaps = 3;                    // dSSIM / d (mean y, E[y^2], E[xy])
constexpr float kC1 = 0.01f * 0.01f;
constexpr float kC2 = 0.03f * 0.03f;

__device__ __forceinline__ int64_t pixel_index(const SsimParams& p, int row, int col, int channel) {
  return (static_cast<int64_t>(row) * p.width + col) * p.channels + channel;
}

__device__ __forceinline__ int64_t map_index(const SsimParams& p, int map, int row, int col, int channel) {
  const int valid_h = p.height - kHalo, valid_w = p.width - kHalo;
  return ((static_cast<int64_t>(map) * p.channels + channel) * valid_h + row) * valid_w + col;
}

// The block's sum of `value` (every thread calls it).
__device__ float block_sum(float value, float* warp_sums) {
  for (int offset = 16; offset > 0; offset >>= 1) value += __shfl_down_sync(0xffffffffu, value, offset);
  const int tid = threadIdx.y * kSsimBlock + threadIdx.x;
  if ((tid & 31) == 0) warp_sums[tid >> 5] = value;
  __syncthreads();
  float total = 0.0f;
  if (tid == 0) {
    for (int w = 0; w < kThreads / 32; ++w) total += warp_sums[w];
  }
  return total;
}

__global__ void __launch_bounds__(kThreads) ssim_forward_kernel(SsimParams p, float* partials, float* dmaps) {
  __shared__ float sx[kSpan][kSpan];
  __shared__ float sy[kSpan][kSpan];
  __shared__ float along_rows[kMoments][kSpan][kSsimBlock];
  __shared__ float warp_sums[kThreads / 32];
  const int channel = blockIdx.z;
  const int row0 = blockIdx.y * kSsimBlock, col0 = blockIdx.x * kSsimBlock;
  const int tid = threadIdx.y * kSsimBlock + threadIdx.x;

  for (int i = tid; i < kSpan * kSpan; i += kThreads) {
    const int r = row0 + i / kSpan, c = col0 + i % kSpan;
    const bool inside = r < p.height && c < p.width;  // outside: read only by positions past the valid ones
    sx[i / kSpan][i % kSpan] = inside ? p.x[pixel_index(p, r, c, channel)] : 0.0f;
    sy[i / kSpan][i % kSpan] = inside ? p.y[pixel_index(p, r, c, channel)] : 0.0f;
  }
  __syncthreads();
  for (int i = tid; i < kSpan * kSsimBlock; i += kThreads) {
    const int r = i / kSsimBlock, c = i % kSsimBlock;
    float m[kMoments] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
    for (int k = 0; k < kSsimWindow; ++k) {
      const float w = p.window[k], a = sx[r][c + k], b = sy[r][c + k];
      m[0] += w * a;
      m[1] += w * b;
      m[2] += w * a * a;
      m[3] += w * b * b;
      m[4] += w * a * b;
    }
#pragma unroll
    for (int j = 0; j < kMoments; ++j) along_rows[j][r][c] = m[j];
  }
  __syncthreads();

  const int row = row0 + threadIdx.y, col = col0 + threadIdx.x;
  float ssim = 0.0f;
  if (row < p.height - kHalo && col < p.width - kHalo) {
    float m[kMoments] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
    for (int k = 0; k < kSsimWindow; ++k) {
#pragma unroll
      for (int j = 0; j < kMoments; ++j) m[j] += p.window[k] * along_rows[j][threadIdx.y + k][threadIdx.x];
    }
    const float mx = m[0], my = m[1];
    const float var_x = m[2] - mx * mx, var_y = m[3] - my * my, cov = m[4] - mx * my;
    const float lum_num = 2.0f * mx * my + kC1, lum_den = mx * mx + my * my + kC1;
    const float cs_num = 2.0f * cov + kC2, cs_den = var_x + var_y + kC2;
    const float lum = lum_num / lum_den, cs = cs_num / cs_den;
    ssim = lum * cs;
    // d/d var_y and d/d cov at fixed means; var_y = E[y^2] - my^2 and cov = E[xy] - mx my carry the means' share
    const float d_yy = -ssim / cs_den;
    const float d_xy = 2.0f * lum / cs_den;
    const float d_my = cs * 2.0f * (mx - lum * my) / lum_den - 2.0f * my * d_yy - mx * d_xy;
    dmaps[map_index(p, 0, row, col, channel)] = d_my;
    dmaps[map_index(p, 1, row, col, channel)] = d_yy;
    dmaps[map_index(p, 2, row, col, channel)] = d_xy;
  }
  const float total = block_sum(ssim, warp_sums);
  if (tid == 0) partials[(static_cast<int64_t>(blockIdx.z) * gridDim.y + blockIdx.y) * gridDim.x + blockIdx.x] = total;
}

__global__ void __launch_bounds__(kThreads)
    ssim_backward_kernel(SsimParams p, const float* dmaps, const float* v_ssim, float scale, float* v_y) {
  __shared__ float sd[kMaps][kSpan][kSpan];
  __shared__ float along_rows[kMaps][kSpan][kSsimBlock];
  const int channel = blockIdx.z;
  const int row0 = blockIdx.y * kSsimBlock, col0 = blockIdx.x * kSsimBlock;
  const int tid = threadIdx.y * kSsimBlock + threadIdx.x;
  const int valid_h = p.height - kHalo, valid_w = p.width - kHalo;

  // the positions whose windows cover this block's pixels: halo above and to the left; zero where not valid
  for (int i = tid; i < kSpan * kSpan; i += kThreads) {
    const int r = row0 - kHalo + i / kSpan, c = col0 - kHalo + i % kSpan;
    const bool valid = r >= 0 && r < valid_h && c >= 0 && c < valid_w;
#pragma unroll
    for (int j = 0; j < kMaps; ++j) sd[j][i / kSpan][i % kSpan] = valid ? dmaps[map_index(p, j, r, c, channel)] : 0.0f;
  }
  __syncthreads();
  // pixel column c is covered by positions c - k, weighted window[k]
  for (int i = tid; i < kSpan * kSsimBlock; i += kThreads) {
    const int r = i / kSsimBlock, c = i % kSsimBlock;
    float s[kMaps] = {0.0f, 0.0f, 0.0f};
#pragma unroll
    for (int k = 0; k < kSsimWindow; ++k) {
#pragma unroll
      for (int j = 0; j < kMaps; ++j) s[j] += p.window[k] * sd[j][r][c + kHalo - k];
    }
#pragma unroll
    for (int j = 0; j < kMaps; ++j) along_rows[j][r][c] = s[j];
  }
  __syncthreads();

  const int row = row0 + threadIdx.y, col = col0 + threadIdx.x;
  if (row >= p.height || col >= p.width) return;
  float s[kMaps] = {0.0f, 0.0f, 0.0f};
#pragma unroll
  for (int k = 0; k < kSsimWindow; ++k) {
#pragma unroll
    for (int j = 0; j < kMaps; ++j) s[j] += p.window[k] * along_rows[j][threadIdx.y + kHalo - k][threadIdx.x];
  }
  const int64_t at = pixel_index(p, row, col, channel);
  const float grad = s[0] + 2.0f * p.y[at] * s[1] + p.x[at] * s[2];
  v_y[at] = grad * scale * (v_ssim != nullptr ? *v_ssim : 1.0f);
}

dim3 blocks_over(int height, int width, int channels) {
  return dim3((width + kSsimBlock - 1) / kSsimBlock, (height + kSsimBlock - 1) / kSsimBlock, channels);
}

}  // namespace

int ssim_forward_blocks(int height, int width, int channels) {
  const dim3 grid = blocks_over(height - kHalo, width - kHalo, channels);
  return static_cast<int>(grid.x * grid.y * grid.z);
}

cudaError_t launch_ssim_forward(const SsimParams& p, float* partials, float* dmaps, cudaStream_t stream) {
  ssim_forward_kernel<<<blocks_over(p.height - kHalo, p.width - kHalo, p.channels), dim3(kSsimBlock, kSsimBlock), 0,
                        stream>>>(p, partials, dmaps);
  return cudaGetLastError();
}

cudaError_t launch_ssim_backward(const SsimParams& p, const float* dmaps, const float* v_ssim, float scale,
                                 float* v_y, cudaStream_t stream) {
  ssim_backward_kernel<<<blocks_over(p.height, p.width, p.channels), dim3(kSsimBlock, kSsimBlock), 0, stream>>>(
      p, dmaps, v_ssim, scale, v_y);
  return cudaGetLastError();
}

}  // namespace bytesplat
