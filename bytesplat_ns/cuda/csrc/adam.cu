// Adam over every parameter group in one launch: see adam.h.
#include "adam.h"
#include "end_to_end.cuh"

namespace bytesplat {
namespace {

constexpr int kAdamThreads = 256;

__global__ void __launch_bounds__(kAdamThreads) adam_kernel(const AdamParams p) {
  __shared__ float step_size[kMaxAdamGroups];   // lr / (1 - b1^t)
  __shared__ float inv_bc2_sqrt[kMaxAdamGroups];  // 1 / sqrt(1 - b2^t)
  if (p.skip != nullptr && *p.skip) return;  // every block: the counter stays at zero, the steps as they are
  if (threadIdx.x < p.groups) {
    const int g = static_cast<int>(threadIdx.x);
    const double t = static_cast<double>(*p.step[g]) + 1.0;
    step_size[g] = static_cast<float>(p.lrs[g] / (1.0 - pow(static_cast<double>(p.beta1[g]), t)));
    inv_bc2_sqrt[g] = static_cast<float>(1.0 / sqrt(1.0 - pow(static_cast<double>(p.beta2[g]), t)));
  }
  __syncthreads();
  const int64_t total = p.end[p.groups - 1];
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += stride) {
    const EndToEnd at = EndToEnd::locate(i, p.end);
    const int g = at.buffer;
    const int64_t e = at.index;
    if (p.visible != nullptr && p.row_width[g] > 0 && !p.visible[e / p.row_width[g]]) continue;
    const float grad = p.grad[g][e];
    const float b1 = p.beta1[g], b2 = p.beta2[g];
    const float m = b1 * p.exp_avg[g][e] + (1.f - b1) * grad;
    const float v = b2 * p.exp_avg_sq[g][e] + (1.f - b2) * grad * grad;
    p.exp_avg[g][e] = m;
    p.exp_avg_sq[g][e] = v;
    p.param[g][e] -= step_size[g] * m / (sqrtf(v) * inv_bc2_sqrt[g] + p.eps[g]);
  }
  // Every thread of this block has read the steps; the last block of the grid advances them.
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();
    if (atomicAdd(p.blocks_done, 1u) == gridDim.x - 1) {
      for (int g = 0; g < p.groups; ++g) *p.step[g] += 1.f;
      *p.blocks_done = 0u;
    }
  }
}

}  // namespace

cudaError_t launch_adam(const AdamParams& p, cudaStream_t stream) {
  if (p.groups <= 0) return cudaSuccess;
  unsigned blocks = 0;
  const cudaError_t err = end_to_end_blocks(p.end[p.groups - 1], kAdamThreads, blocks);
  if (err != cudaSuccess) return err;
  adam_kernel<<<blocks, kAdamThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace bytesplat
