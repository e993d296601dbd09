// Host side of the forward rasterization: checks, allocation, launch on the current stream.
#include "rasterize_forward.h"

namespace bytesplat {

std::tuple<at::Tensor, at::Tensor> rasterize_forward(const at::Tensor& means2d, const at::Tensor& conics,
                                                     const at::Tensor& colors, const at::Tensor& opacities,
                                                     const at::Tensor& tile_start, const at::Tensor& tile_end,
                                                     const at::Tensor& flatten_ids, int64_t width, int64_t height,
                                                     int64_t tiles_x, int64_t tile_size, bool poison) {
  const c10::cuda::CUDAGuard guard(means2d.device());
  const SplatInputs splats = splat_inputs(means2d, conics, colors, opacities);
  const TileLists tiles = tile_lists(tile_start, tile_end, flatten_ids, width, height, tiles_x, tile_size);
  const int64_t cdim = check_channels(colors.size(1));
  at::Tensor render = image_output(means2d, height, width, cdim, poison);
  at::Tensor alpha = image_output(means2d, height, width, 1, poison);
  const ForwardParams p{splats, tiles, static_cast<int>(width), static_cast<int>(height), render.data_ptr<float>(),
                        alpha.data_ptr<float>()};
  BYTESPLAT_CHECK_CUDA_STATUS(
      launch_rasterize_forward(p, static_cast<int>(cdim), c10::cuda::getCurrentCUDAStream().stream()));
  return {render, alpha};
}

}  // namespace bytesplat
