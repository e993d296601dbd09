// Host side of the sync-free tile binning: checks, allocation, the two passes on the current stream.
#include "bin_tiles.h"

namespace bytesplat {

std::vector<at::Tensor> bin_tiles(const at::Tensor& means2d, const at::Tensor& radii, const at::Tensor& depths,
                                  int64_t tiles_x, int64_t tiles_y, int64_t tile_size, int64_t capacity) {
  const c10::cuda::CUDAGuard guard(means2d.device());
  BYTESPLAT_CHECK_INPUT(means2d, at::kFloat);
  BYTESPLAT_CHECK_INPUT(radii, at::kInt);
  BYTESPLAT_CHECK_INPUT(depths, at::kFloat);
  const int64_t n = means2d.size(0);
  check_shape(means2d, {n, 2}, "means2d");
  check_shape(radii, {n}, "radii");
  check_shape(depths, {n}, "depths");
  const int tile = check_tile_size(tile_size);
  BYTESPLAT_CHECK(tiles_x > 0 && tiles_y > 0 && tiles_x * tiles_y < (int64_t{1} << 30), "bad tile grid ", tiles_x,
              "x", tiles_y);
  BYTESPLAT_CHECK(n < (int64_t{1} << 31) && capacity < (int64_t{1} << 31), "more than 2^31 splats or entries");
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream().stream();
  const auto longs = means2d.options().dtype(at::kLong);
  const auto ints = means2d.options().dtype(at::kInt);

  at::Tensor tiles_per = at::empty({n}, longs);
  at::Tensor ends = at::empty({n}, longs);
  at::Tensor total = at::empty({1}, longs);
  BinParams p{means2d.data_ptr<float>(), radii.data_ptr<int32_t>(), depths.data_ptr<float>(),
              static_cast<int>(n), static_cast<int>(tiles_x), static_cast<int>(tiles_y), tile, 1,
              tiles_per.data_ptr<int64_t>(), ends.data_ptr<int64_t>(), nullptr, nullptr, nullptr, nullptr, nullptr,
              nullptr, total.data_ptr<int64_t>()};
  const auto bytes = means2d.options().dtype(at::kByte);
  at::Tensor scan_temp = at::empty({static_cast<int64_t>(count_tiles_temp_bytes(p))}, bytes);
  BYTESPLAT_CHECK_CUDA_STATUS(launch_count_tiles(p, scan_temp.data_ptr(), scan_temp.numel(), stream));
  if (capacity < 0) capacity = total.item<int64_t>();  // exact: the one host read
  BYTESPLAT_CHECK(capacity < (int64_t{1} << 31), "more than 2^31 tile entries");
  p.capacity = static_cast<int>(std::max<int64_t>(capacity, 1));

  at::Tensor keys_unsorted = at::empty({p.capacity}, longs);
  at::Tensor ids_unsorted = at::empty({p.capacity}, ints);
  at::Tensor keys = at::empty({p.capacity}, longs);
  at::Tensor ids = at::empty({p.capacity}, ints);
  at::Tensor offsets = at::empty({tiles_y * tiles_x}, ints);
  at::Tensor kept = at::empty({1}, ints);
  p.keys_unsorted = keys_unsorted.data_ptr<int64_t>();
  p.ids_unsorted = ids_unsorted.data_ptr<int32_t>();
  p.keys = keys.data_ptr<int64_t>();
  p.ids = ids.data_ptr<int32_t>();
  p.offsets = offsets.data_ptr<int32_t>();
  p.kept = kept.data_ptr<int32_t>();
  at::Tensor sort_temp = at::empty({static_cast<int64_t>(fill_tiles_temp_bytes(p))}, bytes);
  BYTESPLAT_CHECK_CUDA_STATUS(launch_fill_tiles(p, sort_temp.data_ptr(), sort_temp.numel(), stream));
  return {keys, ids, offsets, kept, total};
}

}  // namespace bytesplat
