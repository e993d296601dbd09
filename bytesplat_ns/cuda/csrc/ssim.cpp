// Host side of the SSIM kernels: checks, the Gaussian window, allocation, launches on the current stream.
#include "ssim.h"

#include <cmath>
#include <limits>

namespace bytesplat {
namespace {

constexpr float kSigma = 1.5f;

SsimParams ssim_params(const at::Tensor& x, const at::Tensor& y) {
  BYTESPLAT_CHECK_INPUT(x, at::kFloat);
  BYTESPLAT_CHECK_INPUT(y, at::kFloat);
  BYTESPLAT_CHECK(x.dim() == 3, "SSIM takes [H, W, C] images, got ", x.sizes());
  BYTESPLAT_CHECK(x.sizes() == y.sizes(), "SSIM takes two images of one shape, got ", x.sizes(), " and ", y.sizes());
  BYTESPLAT_CHECK(x.device() == y.device(), "SSIM's images must be on one device, got ", x.device(), " and ", y.device());
  BYTESPLAT_CHECK(x.size(0) >= kSsimWindow && x.size(1) >= kSsimWindow, "the SSIM kernel needs images of at least ",
              kSsimWindow, "x", kSsimWindow, " pixels, got ", x.size(0), "x", x.size(1),
              " (bytesplat_ns/ssim.py uses pytorch_msssim for smaller ones)");
  BYTESPLAT_CHECK(x.numel() < std::numeric_limits<int32_t>::max(), "SSIM: image too large");
  SsimParams p{};
  p.x = x.data_ptr<float>();
  p.y = y.data_ptr<float>();
  p.height = static_cast<int>(x.size(0));
  p.width = static_cast<int>(x.size(1));
  p.channels = static_cast<int>(x.size(2));
  float sum = 0.0f;  // pytorch_msssim's window: exp(-d^2 / (2 sigma^2)) at d = -5..5 in float32, normalised
  for (int k = 0; k < kSsimWindow; ++k) {
    const float d = static_cast<float>(k - kSsimWindow / 2);
    p.window[k] = std::exp(-(d * d) / (2.0f * kSigma * kSigma));
    sum += p.window[k];
  }
  for (float& w : p.window) w /= sum;
  return p;
}

}  // namespace

std::tuple<at::Tensor, at::Tensor> ssim_forward(const at::Tensor& x, const at::Tensor& y, bool poison) {
  const SsimParams p = ssim_params(x, y);
  const c10::cuda::CUDAGuard guard(x.device());
  const int64_t valid_h = p.height - (kSsimWindow - 1), valid_w = p.width - (kSsimWindow - 1);
  at::Tensor partials = at::empty({ssim_forward_blocks(p.height, p.width, p.channels)}, x.options());
  at::Tensor dmaps = at::empty({3, p.channels, valid_h, valid_w}, x.options());
  if (poison) {
    partials.fill_(std::numeric_limits<float>::quiet_NaN());
    dmaps.fill_(std::numeric_limits<float>::quiet_NaN());
  }
  BYTESPLAT_CHECK_CUDA_STATUS(launch_ssim_forward(p, partials.data_ptr<float>(), dmaps.data_ptr<float>(),
                                                  c10::cuda::getCurrentCUDAStream().stream()));
  return {partials, dmaps};
}

at::Tensor ssim_backward(const at::Tensor& x, const at::Tensor& y, const at::Tensor& dmaps, const at::Tensor& v_ssim,
                         double scale, bool poison) {
  const SsimParams p = ssim_params(x, y);
  const c10::cuda::CUDAGuard guard(x.device());
  BYTESPLAT_CHECK_INPUT(dmaps, at::kFloat);
  check_shape(dmaps, {3, p.channels, p.height - (kSsimWindow - 1), p.width - (kSsimWindow - 1)}, "dmaps");
  BYTESPLAT_CHECK_INPUT(v_ssim, at::kFloat);
  check_shape(v_ssim, {1}, "v_ssim");
  at::Tensor v_y = at::empty_like(y);
  if (poison) v_y.fill_(std::numeric_limits<float>::quiet_NaN());
  BYTESPLAT_CHECK_CUDA_STATUS(launch_ssim_backward(p, dmaps.data_ptr<float>(), v_ssim.data_ptr<float>(),
                                                   static_cast<float>(scale), v_y.data_ptr<float>(),
                                                   c10::cuda::getCurrentCUDAStream().stream()));
  return v_y;
}

}  // namespace bytesplat
