// Gradient buffers scaled in place by a device scalar, nothing done when it is 1: see scale_grads.h.
#include "end_to_end.cuh"
#include "scale_grads.h"

namespace bytesplat {
namespace {

constexpr int kScaleThreads = 256;

__global__ void __launch_bounds__(kScaleThreads) scale_kernel(const ScaleParams p) {
  const float s = *p.scale;
  if (s == 1.f) return;  // the same for every thread: nothing to do
  const int64_t total = p.end[p.buffers - 1];
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += stride) {
    const EndToEnd at = EndToEnd::locate(i, p.end);
    p.data[at.buffer][at.index] *= p.magnitude[at.buffer] ? fabsf(s) : s;
  }
}

}  // namespace

cudaError_t launch_scale_grads(const ScaleParams& p, cudaStream_t stream) {
  if (p.buffers <= 0 || p.end[p.buffers - 1] == 0) return cudaSuccess;
  unsigned blocks = 0;
  const cudaError_t err = end_to_end_blocks(p.end[p.buffers - 1], kScaleThreads, blocks);
  if (err != cudaSuccess) return err;
  scale_kernel<<<blocks, kScaleThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace bytesplat
