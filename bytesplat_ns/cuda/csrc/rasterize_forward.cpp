// Host side of the forward rasterization: checks, allocation, launch on the current stream.
#include "rasterize_forward.h"

namespace bytesplat {

std::vector<at::Tensor> rasterize_forward(const at::Tensor& means2d, const at::Tensor& conics, const at::Tensor& colors,
                                          const at::Tensor& opacities, const at::Tensor& tile_start,
                                          const at::Tensor& tile_end, const at::Tensor& flatten_ids, int64_t width,
                                          int64_t height, int64_t tiles_x, int64_t tile_size, bool keep_state,
                                          bool poison) {
  const c10::cuda::CUDAGuard guard(means2d.device());
  const SplatInputs splats = splat_inputs(means2d, conics, colors, opacities);
  const TileLists tiles = tile_lists(tile_start, tile_end, flatten_ids, width, height, tiles_x, tile_size);
  const int64_t cdim = check_channels(colors.size(1));
  at::Tensor render = image_output(means2d, height, width, cdim, poison);
  at::Tensor alpha = image_output(means2d, height, width, 1, poison);
  const auto kept = [&](int64_t n, at::ScalarType dtype, double poisoned) {
    at::Tensor t = at::empty({keep_state ? n : 0}, means2d.options().dtype(dtype));
    if (poison) t.fill_(poisoned);
    return t;
  };
  at::Tensor transmittance = kept(height * width, at::kFloat, std::numeric_limits<double>::quiet_NaN());
  at::Tensor last = kept(height * width, at::kInt, -1);
  at::Tensor bits = kept(pass_bits_size(tiles, flatten_ids.numel()), at::kInt, 0);
  PassState keep{};
  if (keep_state) {
    keep = PassState{render.data_ptr<float>(), transmittance.data_ptr<float>(), last.data_ptr<int32_t>(),
                     reinterpret_cast<uint32_t*>(bits.data_ptr<int32_t>())};
  }
  const ForwardParams p{splats, tiles, static_cast<int>(width), static_cast<int>(height), render.data_ptr<float>(),
                        alpha.data_ptr<float>(), keep};
  BYTESPLAT_CHECK_CUDA_STATUS(
      launch_rasterize_forward(p, static_cast<int>(cdim), c10::cuda::getCurrentCUDAStream().stream()));
  if (keep_state) {
    transmittance = transmittance.view({height, width});
    last = last.view({height, width});
  }
  return {render, alpha, transmittance, last, bits};
}

}  // namespace bytesplat
