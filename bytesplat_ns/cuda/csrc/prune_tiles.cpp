// Host side of tile ranges and pruning: checks, allocation, launch on the current stream.
#include "prune_tiles.h"

namespace bytesplat {

std::tuple<at::Tensor, at::Tensor> tile_ranges(const at::Tensor& offsets, at::Tensor flatten_ids,
                                               const at::Tensor& means2d, const at::Tensor& conics,
                                               const at::Tensor& opacities, const c10::optional<at::Tensor>& kept,
                                               int64_t tiles_x, int64_t tile_size, int64_t capacity) {
  const c10::cuda::CUDAGuard guard(means2d.device());
  BYTESPLAT_CHECK_INPUT(offsets, at::kInt);
  BYTESPLAT_CHECK_INPUT(flatten_ids, at::kInt);
  BYTESPLAT_CHECK_INPUT(means2d, at::kFloat);
  BYTESPLAT_CHECK_INPUT(conics, at::kFloat);
  BYTESPLAT_CHECK_INPUT(opacities, at::kFloat);
  if (kept.has_value()) {
    BYTESPLAT_CHECK_INPUT(kept.value(), at::kInt);
    check_shape(kept.value(), {1}, "kept");
  }
  const int tile = check_tile_size(tile_size);
  const int64_t n_tiles = offsets.numel();
  BYTESPLAT_CHECK(tiles_x > 0 && n_tiles % tiles_x == 0, "offsets must hold tiles_y * tiles_x values");
  BYTESPLAT_CHECK(flatten_ids.numel() < (int64_t{1} << 31), "too many tile entries for int32 offsets");
  at::Tensor tile_end = at::empty({n_tiles}, offsets.options());
  at::Tensor pruned = at::zeros({1}, offsets.options());
  const SplatInputs splats{means2d.data_ptr<float>(), conics.data_ptr<float>(), nullptr,
                           opacities.data_ptr<float>()};
  const PruneParams p{offsets.data_ptr<int32_t>(),
                      flatten_ids.data_ptr<int32_t>(),
                      static_cast<int>(flatten_ids.numel()),
                      kept.has_value() ? kept->data_ptr<int32_t>() : nullptr,
                      splats,
                      static_cast<int>(tiles_x),
                      static_cast<int>(n_tiles / tiles_x),
                      tile,
                      static_cast<int>(capacity),
                      tile_end.data_ptr<int32_t>(),
                      pruned.data_ptr<int32_t>()};
  BYTESPLAT_CHECK_CUDA_STATUS(launch_prune_tiles(p, c10::cuda::getCurrentCUDAStream().stream()));
  return {tile_end, pruned};
}

}  // namespace bytesplat
