// One grid over several buffers laid end to end (the one-launch Adam, the gradient scaling): which buffer an
// element index falls in, and how many blocks a grid-stride loop over them takes.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace bytesplat {

// Element `i` of buffers whose element counts add up to end[0], end[1], ... (cumulative): its buffer and its
// index there. i < end[last].
struct EndToEnd {
  int buffer;
  int64_t index;

  __device__ static EndToEnd locate(int64_t i, const int64_t* end) {
    int b = 0;
    while (i >= end[b]) ++b;
    return {b, i - (b > 0 ? end[b - 1] : 0)};
  }
};

// Blocks of `threads` for `total` elements: one element per thread, at most 8 blocks per SM of the current device
// (a grid-stride loop past that), at least one.
inline cudaError_t end_to_end_blocks(int64_t total, int threads, unsigned& blocks) {
  int device = 0, sms = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err == cudaSuccess) err = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  if (err != cudaSuccess) return err;
  const int64_t wanted = (total + threads - 1) / threads;
  const int64_t most = static_cast<int64_t>(sms) * 8;
  blocks = static_cast<unsigned>(wanted < 1 ? 1 : (wanted < most ? wanted : most));
  return cudaSuccess;
}

}  // namespace bytesplat
