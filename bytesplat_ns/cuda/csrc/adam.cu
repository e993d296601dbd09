// Adam over every parameter group in one launch: see adam.h.
#include "adam.h"
#include "end_to_end.cuh"

namespace bytesplat {
namespace {

constexpr int kAdamThreads = 256;

// torch's fused Adam on one element, in place.
__device__ inline void adam_update(float& param, float& m, float& v, float grad, float b1, float b2, float step_size,
                                   float inv_bc2_sqrt, float eps) {
  m = b1 * m + (1.f - b1) * grad;
  v = b2 * v + (1.f - b2) * grad * grad;
  param -= step_size * m / (sqrtf(v) * inv_bc2_sqrt + eps);
}

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
    const int64_t first = at.index * kAdamVector;
    const float b1 = p.beta1[g], b2 = p.beta2[g], size = step_size[g], inv = inv_bc2_sqrt[g], eps = p.eps[g];
    const bool masked = p.visible != nullptr && p.row_width[g] > 0;
    if (p.aligned[g] && !masked && first + kAdamVector <= p.numel[g]) {
      float4 param = *reinterpret_cast<const float4*>(p.param[g] + first);
      const float4 grad = *reinterpret_cast<const float4*>(p.grad[g] + first);
      float4 m = *reinterpret_cast<const float4*>(p.exp_avg[g] + first);
      float4 v = *reinterpret_cast<const float4*>(p.exp_avg_sq[g] + first);
      adam_update(param.x, m.x, v.x, grad.x, b1, b2, size, inv, eps);
      adam_update(param.y, m.y, v.y, grad.y, b1, b2, size, inv, eps);
      adam_update(param.z, m.z, v.z, grad.z, b1, b2, size, inv, eps);
      adam_update(param.w, m.w, v.w, grad.w, b1, b2, size, inv, eps);
      *reinterpret_cast<float4*>(p.param[g] + first) = param;
      *reinterpret_cast<float4*>(p.exp_avg[g] + first) = m;
      *reinterpret_cast<float4*>(p.exp_avg_sq[g] + first) = v;
      continue;
    }
    const int64_t last = min(first + kAdamVector, p.numel[g]);
    for (int64_t e = first; e < last; ++e) {
      if (masked && !p.visible[e / p.row_width[g]]) continue;
      adam_update(p.param[g][e], p.exp_avg[g][e], p.exp_avg_sq[g][e], p.grad[g][e], b1, b2, size, inv, eps);
    }
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
