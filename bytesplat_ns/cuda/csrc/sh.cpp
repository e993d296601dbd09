// Host side of the SH kernels: checks, allocation, launches on the current stream.
#include "sh.h"

#include <limits>

namespace bytesplat {
namespace {

ShParams sh_params(int64_t degree, const at::Tensor& coeffs, const at::Tensor& dirs) {
  BYTESPLAT_CHECK_INPUT(coeffs, at::kFloat);
  BYTESPLAT_CHECK_INPUT(dirs, at::kFloat);
  BYTESPLAT_CHECK(degree >= 0 && degree <= kShMaxDegree, "SH degree must be 0 to ", kShMaxDegree, ", got ", degree);
  const int64_t n = dirs.size(0);
  check_shape(dirs, {n, 3}, "dirs");
  BYTESPLAT_CHECK(coeffs.dim() == 3 && coeffs.size(0) == n && coeffs.size(2) == 3, "coeffs must be [N, K, 3] with N = ",
                  n, ", got ", coeffs.sizes());
  const int64_t bases = (degree + 1) * (degree + 1);
  BYTESPLAT_CHECK(coeffs.size(1) >= bases, "SH degree ", degree, " needs ", bases, " coefficients per splat, got ",
                  coeffs.size(1));
  BYTESPLAT_CHECK(coeffs.size(1) <= (kShMaxDegree + 1) * (kShMaxDegree + 1), "coeffs may hold at most ",
                  (kShMaxDegree + 1) * (kShMaxDegree + 1), " coefficients per splat (degree ", kShMaxDegree,
                  "); slice them to the degree rendered, got ", coeffs.size(1));
  BYTESPLAT_CHECK(coeffs.device() == dirs.device(), "coeffs and dirs must be on one device, got ", coeffs.device(),
                  " and ", dirs.device());
  ShParams p{};
  p.coeffs = coeffs.data_ptr<float>();
  p.dirs = dirs.data_ptr<float>();
  p.n = n;
  p.k = static_cast<int>(coeffs.size(1));
  p.degree = static_cast<int>(degree);
  return p;
}

}  // namespace

at::Tensor sh_forward(int64_t degree, const at::Tensor& coeffs, const at::Tensor& dirs, bool poison) {
  const ShParams p = sh_params(degree, coeffs, dirs);
  const c10::cuda::CUDAGuard guard(dirs.device());
  at::Tensor rgb = at::empty({p.n, 3}, dirs.options());
  if (poison) rgb.fill_(std::numeric_limits<float>::quiet_NaN());
  BYTESPLAT_CHECK_CUDA_STATUS(launch_sh_forward(p, rgb.data_ptr<float>(), c10::cuda::getCurrentCUDAStream().stream()));
  return rgb;
}

std::tuple<at::Tensor, at::Tensor> sh_backward(int64_t degree, const at::Tensor& coeffs, const at::Tensor& dirs,
                                               const at::Tensor& v_rgb, bool poison) {
  const ShParams p = sh_params(degree, coeffs, dirs);
  const c10::cuda::CUDAGuard guard(dirs.device());
  BYTESPLAT_CHECK_INPUT(v_rgb, at::kFloat);
  check_shape(v_rgb, {p.n, 3}, "v_rgb");
  at::Tensor v_coeffs = at::empty_like(coeffs);
  at::Tensor v_dirs = at::empty_like(dirs);
  if (poison) {
    v_coeffs.fill_(std::numeric_limits<float>::quiet_NaN());
    v_dirs.fill_(std::numeric_limits<float>::quiet_NaN());
  }
  BYTESPLAT_CHECK_CUDA_STATUS(launch_sh_backward(p, v_rgb.data_ptr<float>(), v_coeffs.data_ptr<float>(),
                                                 v_dirs.data_ptr<float>(), c10::cuda::getCurrentCUDAStream().stream()));
  return {v_coeffs, v_dirs};
}

}  // namespace bytesplat
