// Gradient buffers scaled in place by a device scalar, nothing done when it is 1: see scale_grads.h.
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
    int b = 0;
    while (i >= p.end[b]) ++b;
    const int64_t e = i - (b > 0 ? p.end[b - 1] : 0);
    p.data[b][e] *= p.magnitude[b] ? fabsf(s) : s;
  }
}

}  // namespace

cudaError_t launch_scale_grads(const ScaleParams& p, cudaStream_t stream) {
  if (p.buffers <= 0 || p.end[p.buffers - 1] == 0) return cudaSuccess;
  int device = 0, sms = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err == cudaSuccess) err = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  if (err != cudaSuccess) return err;
  const int64_t total = p.end[p.buffers - 1];
  const int64_t wanted = (total + kScaleThreads - 1) / kScaleThreads;
  const int64_t most = static_cast<int64_t>(sms) * 8;  // a grid-stride loop past that
  const unsigned blocks = static_cast<unsigned>(wanted < most ? wanted : most);
  scale_kernel<<<blocks, kScaleThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace bytesplat
