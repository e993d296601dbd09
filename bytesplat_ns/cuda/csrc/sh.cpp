// Host side of the SH kernels: checks, allocation, launches on the current stream.
#include "sh.h"

#include <limits>

namespace bytesplat {
namespace {

ShParams sh_params(int64_t degree, const at::Tensor& dc, const at::Tensor& rest, const at::Tensor& dirs,
                   const std::optional<at::Tensor>& radii) {
  BYTESPLAT_CHECK_INPUT(dc, at::kFloat);
  BYTESPLAT_CHECK_INPUT(rest, at::kFloat);
  BYTESPLAT_CHECK_INPUT(dirs, at::kFloat);
  BYTESPLAT_CHECK(degree >= 0 && degree <= kShMaxDegree, "SH degree must be 0 to ", kShMaxDegree, ", got ", degree);
  const int64_t n = dirs.size(0);
  check_shape(dirs, {n, 3}, "dirs");
  check_shape(dc, {n, 3}, "dc");
  BYTESPLAT_CHECK(rest.dim() == 3 && rest.size(0) == n && rest.size(2) == 3, "rest must be [N, K - 1, 3] with N = ",
                  n, ", got ", rest.sizes());
  const int64_t k = 1 + rest.size(1);
  const int64_t bases = (degree + 1) * (degree + 1);
  BYTESPLAT_CHECK(k >= bases, "SH degree ", degree, " needs ", bases, " coefficients per splat, got ", k);
  BYTESPLAT_CHECK(k <= (kShMaxDegree + 1) * (kShMaxDegree + 1), "coeffs may hold at most ",
                  (kShMaxDegree + 1) * (kShMaxDegree + 1), " coefficients per splat (degree ", kShMaxDegree,
                  "); slice them to the degree rendered, got ", k);
  BYTESPLAT_CHECK(dc.device() == dirs.device() && rest.device() == dirs.device(),
                  "dc, rest and dirs must be on one device, got ", dc.device(), ", ", rest.device(), " and ",
                  dirs.device());
  ShParams p{};
  p.dc = dc.data_ptr<float>();
  p.rest = k > 1 ? rest.data_ptr<float>() : nullptr;
  p.dirs = dirs.data_ptr<float>();
  p.n = n;
  p.k = static_cast<int>(k);
  p.degree = static_cast<int>(degree);
  p.radii = nullptr;
  if (radii.has_value()) {
    BYTESPLAT_CHECK_INPUT(*radii, at::kInt);
    check_shape(*radii, {n}, "radii");
    BYTESPLAT_CHECK(radii->device() == dirs.device(), "radii must be on the device of dirs, got ", radii->device());
    p.radii = radii->data_ptr<int32_t>();
  }
  return p;
}

}  // namespace

at::Tensor sh_forward(int64_t degree, const at::Tensor& dc, const at::Tensor& rest, const at::Tensor& dirs,
                      bool poison, const std::optional<at::Tensor>& radii) {
  const ShParams p = sh_params(degree, dc, rest, dirs, radii);
  const c10::cuda::CUDAGuard guard(dirs.device());
  at::Tensor rgb = at::empty({p.n, 3}, dirs.options());
  if (poison) rgb.fill_(std::numeric_limits<float>::quiet_NaN());
  BYTESPLAT_CHECK_CUDA_STATUS(launch_sh_forward(p, rgb.data_ptr<float>(), c10::cuda::getCurrentCUDAStream().stream()));
  return rgb;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> sh_backward(int64_t degree, const at::Tensor& dc, const at::Tensor& rest,
                                                           const at::Tensor& dirs, const at::Tensor& v_rgb,
                                                           bool poison, const std::optional<at::Tensor>& radii) {
  const ShParams p = sh_params(degree, dc, rest, dirs, radii);
  const c10::cuda::CUDAGuard guard(dirs.device());
  BYTESPLAT_CHECK_INPUT(v_rgb, at::kFloat);
  check_shape(v_rgb, {p.n, 3}, "v_rgb");
  at::Tensor v_dc = at::empty_like(dc);
  at::Tensor v_rest = at::empty_like(rest);
  at::Tensor v_dirs = at::empty_like(dirs);
  if (poison) {
    for (at::Tensor* t : {&v_dc, &v_rest, &v_dirs}) t->fill_(std::numeric_limits<float>::quiet_NaN());
  }
  BYTESPLAT_CHECK_CUDA_STATUS(launch_sh_backward(p, v_rgb.data_ptr<float>(), v_dc.data_ptr<float>(),
                                                 p.k > 1 ? v_rest.data_ptr<float>() : nullptr,
                                                 v_dirs.data_ptr<float>(), c10::cuda::getCurrentCUDAStream().stream()));
  return {v_dc, v_rest, v_dirs};
}

}  // namespace bytesplat
