// Host side of the fused forward + backward rasterization: checks, allocation, launch on the current stream.
#include "rasterize_fused.h"

namespace bytesplat {
namespace {

struct GradOutputs {
  at::Tensor means2d, means2d_abs, conics, colors, opacities;
  at::Tensor tail;  // zeroed with the gradients (the loss)
  SplatGrads pointers() {
    return SplatGrads{means2d.data_ptr<float>(), means2d_abs.numel() ? means2d_abs.data_ptr<float>() : nullptr,
                      conics.data_ptr<float>(), colors.data_ptr<float>(), opacities.data_ptr<float>()};
  }
};

// The gradient outputs (and `tail` more floats, the loss), zeroed: slices of one buffer, cleared by one memset.
GradOutputs zero_grads(const at::Tensor& means2d, int64_t cdim, bool absgrad, int64_t tail = 0) {
  const int64_t n = means2d.size(0);
  const int64_t abs_width = absgrad ? 2 : 0;
  const at::Tensor flat = at::zeros({n * (2 + abs_width + 3 + cdim + 1) + tail}, means2d.options());
  int64_t offset = 0;
  const auto take = [&](int64_t width) {
    at::Tensor part = flat.narrow(0, offset, n * width);
    offset += n * width;
    return part;
  };
  GradOutputs g;
  g.means2d = take(2).view({n, 2});
  g.means2d_abs = absgrad ? take(2).view({n, 2}) : at::empty({0}, means2d.options());
  g.conics = take(3).view({n, 3});
  g.colors = take(cdim).view({n, cdim});
  g.opacities = take(1);
  g.tail = flat.narrow(0, offset, tail);
  return g;
}

void check_image(const at::Tensor& t, int64_t height, int64_t width, int64_t channels, const char* name) {
  BYTESPLAT_CHECK_INPUT(t, at::kFloat);
  check_shape(t, {height, width, channels}, name);
}

// The forward kernel's kept state (rasterize_forward with keep_state), checked against the image and the tile
// lists; all null when `resume` is empty. Only the loss mode reads the render (`with_render`); else it may be empty.
PassState resume_state(const std::vector<at::Tensor>& resume, int64_t height, int64_t width, int64_t cdim,
                       const TileLists& tiles, const at::Tensor& flatten_ids, bool with_render) {
  if (resume.empty()) return PassState{};
  BYTESPLAT_CHECK(resume.size() == 4, "resume takes [render, transmittance, last, bits] as rasterize_forward returns "
                  "them with keep_state, got ", resume.size(), " tensors");
  const at::Tensor& render = resume[0];
  const at::Tensor& transmittance = resume[1];
  const at::Tensor& last = resume[2];
  const at::Tensor& bits = resume[3];
  if (with_render || render.numel() > 0) check_image(render, height, width, cdim, "resume render");
  BYTESPLAT_CHECK_INPUT(transmittance, at::kFloat);
  check_shape(transmittance, {height, width}, "resume transmittance");
  BYTESPLAT_CHECK_INPUT(last, at::kInt);
  check_shape(last, {height, width}, "resume last");
  BYTESPLAT_CHECK_INPUT(bits, at::kInt);
  check_shape(bits, {pass_bits_size(tiles, flatten_ids.numel())}, "resume bits");
  return PassState{render.numel() > 0 ? render.data_ptr<float>() : nullptr, transmittance.data_ptr<float>(),
                   last.data_ptr<int32_t>(), reinterpret_cast<uint32_t*>(bits.data_ptr<int32_t>())};
}

}  // namespace

std::vector<at::Tensor> rasterize_backward(const at::Tensor& means2d, const at::Tensor& conics,
                                           const at::Tensor& colors, const at::Tensor& opacities,
                                           const at::Tensor& tile_start, const at::Tensor& tile_end,
                                           const at::Tensor& flatten_ids, int64_t width, int64_t height,
                                           int64_t tiles_x, int64_t tile_size, int64_t capacity,
                                           const at::Tensor& v_render,
                                           const c10::optional<at::Tensor>& v_alpha,
                                           const std::vector<at::Tensor>& resume, bool absgrad) {
  const c10::cuda::CUDAGuard guard(means2d.device());
  const SplatInputs splats = splat_inputs(means2d, conics, colors, opacities);
  const TileLists tiles = tile_lists(tile_start, tile_end, flatten_ids, width, height, tiles_x, tile_size);
  const int64_t cdim = check_channels(colors.size(1));
  BYTESPLAT_CHECK(capacity > 0, "capacity must be positive");
  check_image(v_render, height, width, cdim, "v_render");
  if (v_alpha.has_value()) check_image(*v_alpha, height, width, 1, "v_alpha");
  GradOutputs grads = zero_grads(means2d, cdim, absgrad);
  PixelGradSource src{};
  src.v_render = v_render.data_ptr<float>();
  src.v_alpha = v_alpha.has_value() ? v_alpha->data_ptr<float>() : nullptr;
  const PassState kept = resume_state(resume, height, width, cdim, tiles, flatten_ids, false);
  const FusedParams p{splats,  tiles,   static_cast<int>(width), static_cast<int>(height), static_cast<int>(capacity),
                      src,     nullptr, nullptr,                 grads.pointers(),         kept};
  BYTESPLAT_CHECK_CUDA_STATUS(
      launch_rasterize_fused(p, static_cast<int>(cdim), c10::cuda::getCurrentCUDAStream().stream()));
  return {grads.means2d, grads.means2d_abs, grads.conics, grads.colors, grads.opacities};
}

std::vector<at::Tensor> rasterize_loss(const at::Tensor& means2d, const at::Tensor& conics, const at::Tensor& colors,
                                       const at::Tensor& opacities, const at::Tensor& tile_start,
                                       const at::Tensor& tile_end, const at::Tensor& flatten_ids, int64_t width,
                                       int64_t height, int64_t tiles_x, int64_t tile_size, int64_t capacity,
                                       const at::Tensor& gt,
                                       const c10::optional<at::Tensor>& v_extra,
                                       const c10::optional<at::Tensor>& background,
                                       const std::vector<at::Tensor>& resume, double w_l1, double w_l2, bool clamp,
                                       bool want_image, bool absgrad, bool poison) {
  const c10::cuda::CUDAGuard guard(means2d.device());
  const SplatInputs splats = splat_inputs(means2d, conics, colors, opacities);
  const TileLists tiles = tile_lists(tile_start, tile_end, flatten_ids, width, height, tiles_x, tile_size);
  BYTESPLAT_CHECK(colors.size(1) == 3, "the fused loss takes RGB colours [N, 3], got ", colors.sizes());
  BYTESPLAT_CHECK(capacity > 0, "capacity must be positive");
  check_image(gt, height, width, 3, "gt");
  if (v_extra.has_value()) check_image(*v_extra, height, width, 3, "v_extra");
  if (background.has_value()) {
    BYTESPLAT_CHECK_INPUT(*background, at::kFloat);
    check_shape(*background, {3}, "background");
  }
  BYTESPLAT_CHECK(!(want_image && !resume.empty()), "want_image with resume: the forward kernel rendered the image "
                  "already (resume's render)");
  const PassState kept = resume_state(resume, height, width, 3, tiles, flatten_ids, true);
  GradOutputs grads = zero_grads(means2d, 3, absgrad, 1);
  const at::Tensor loss = grads.tail;
  at::Tensor render = want_image ? image_output(means2d, height, width, 3, poison) : at::empty({0}, means2d.options());
  at::Tensor alpha = want_image ? image_output(means2d, height, width, 1, poison) : at::empty({0}, means2d.options());
  PixelGradSource src{};
  src.gt = gt.data_ptr<float>();
  src.v_extra = v_extra.has_value() ? v_extra->data_ptr<float>() : nullptr;
  src.background = background.has_value() ? background->data_ptr<float>() : nullptr;
  src.w_l1 = static_cast<float>(w_l1);
  src.w_l2 = static_cast<float>(w_l2);
  src.inv_count = static_cast<float>(1.0 / (3.0 * static_cast<double>(width) * static_cast<double>(height)));
  src.clamp = clamp;
  src.loss = loss.data_ptr<float>();
  const FusedParams p{splats,
                      tiles,
                      static_cast<int>(width),
                      static_cast<int>(height),
                      static_cast<int>(capacity),
                      src,
                      want_image ? render.data_ptr<float>() : nullptr,
                      want_image ? alpha.data_ptr<float>() : nullptr,
                      grads.pointers(),
                      kept};
  BYTESPLAT_CHECK_CUDA_STATUS(launch_rasterize_fused(p, 3, c10::cuda::getCurrentCUDAStream().stream()));
  return {loss, grads.means2d, grads.means2d_abs, grads.conics, grads.colors, grads.opacities, render, alpha};
}

int64_t fused_capacity(int64_t cdim, int64_t tile_size, int64_t blocks_per_sm) {
  check_channels(cdim);
  const int tile = check_tile_size(tile_size);
  BYTESPLAT_CHECK(blocks_per_sm > 0, "blocks_per_sm must be positive");
  int device = 0;
  BYTESPLAT_CHECK_CUDA_STATUS(cudaGetDevice(&device));
  const int capacity = fused_tile_capacity(tile, static_cast<int>(cdim), static_cast<int>(blocks_per_sm), device);
  BYTESPLAT_CHECK(capacity > 0, "the device's shared memory per block holds no fused-kernel tile of ", tile,
              " pixels (capacity ", capacity, ")");
  return capacity;
}

}  // namespace bytesplat
