// Gradient buffers scaled in place by a scalar that lives on the device, in one launch: the fused loss path's
// backward (cuda/ops.py) hands out the gradients its forward computed, times the loss's incoming gradient. That
// gradient is 1 when the loss is backpropagated as it is (loss.backward()), and then no block reads or writes
// anything but the scalar: the step skips a read and a write of every gradient (about 200 MB on a 2M-splat
// scene) without reading the scalar on the host. Buffers marked `magnitude` are scaled by |scalar| (the absolute
// 2D-mean gradients densification reads).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace bytesplat {

constexpr int kMaxScaledBuffers = 8;

struct ScaleParams {
  float* data[kMaxScaledBuffers];
  int64_t end[kMaxScaledBuffers];      // elements of buffers 0..b together
  bool magnitude[kMaxScaledBuffers];   // scaled by |scale| instead of scale
  int buffers;
  const float* scale;                  // one value
};

cudaError_t launch_scale_grads(const ScaleParams& p, cudaStream_t stream);

}  // namespace bytesplat

#ifndef __CUDACC__
#include "common.h"

namespace bytesplat {

// grads *= scale and magnitudes *= |scale|, in place: float32 contiguous tensors on scale's device; scale one
// float32 value ([] or [1]). Up to kMaxScaledBuffers tensors in all.
void scale_grads(const std::vector<at::Tensor>& grads, const std::vector<at::Tensor>& magnitudes,
                 const at::Tensor& scale);

}  // namespace bytesplat
#endif
