// Host side of the in-place gradient scaling: checks, the pointer table, the launch on the current stream.
#include "scale_grads.h"

namespace bytesplat {

void scale_grads(const std::vector<at::Tensor>& grads, const std::vector<at::Tensor>& magnitudes,
                 const at::Tensor& scale) {
  BYTESPLAT_CHECK_INPUT(scale, at::kFloat);
  BYTESPLAT_CHECK(scale.numel() == 1, "scale must hold one value, got shape ", scale.sizes());
  const size_t buffers = grads.size() + magnitudes.size();
  BYTESPLAT_CHECK(buffers <= static_cast<size_t>(kMaxScaledBuffers), "at most ", kMaxScaledBuffers,
                  " tensors in one call, got ", buffers);
  const c10::cuda::CUDAGuard guard(scale.device());
  ScaleParams p{};
  int64_t total = 0;
  for (size_t b = 0; b < buffers; ++b) {
    const bool magnitude = b >= grads.size();
    const at::Tensor& t = magnitude ? magnitudes[b - grads.size()] : grads[b];
    BYTESPLAT_CHECK_INPUT(t, at::kFloat);
    BYTESPLAT_CHECK(t.device() == scale.device(), "every tensor must be on ", scale.device(), ", got ", t.device());
    p.data[b] = t.data_ptr<float>();
    total += t.numel();
    p.end[b] = total;
    p.magnitude[b] = magnitude;
  }
  p.buffers = static_cast<int>(buffers);
  p.scale = scale.data_ptr<float>();
  BYTESPLAT_CHECK_CUDA_STATUS(launch_scale_grads(p, c10::cuda::getCurrentCUDAStream().stream()));
}

}  // namespace bytesplat
