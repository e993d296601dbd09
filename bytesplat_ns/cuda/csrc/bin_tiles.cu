// Sync-free tile binning: count tiles per splat, prefix-sum, fill the entries that fit the capacity, pad the
// rest, radix-sort by key (cub), and mark where each tile starts. No host read. The kernels that map a splat to
// tiles are instantiated for 16- and 8-pixel tiles (raster_types.h); the rest work on tile ids alone.
#include <cub/cub.cuh>

#include "bin_tiles.h"
#include "raster_types.h"

namespace bytesplat {
namespace {

constexpr int kThreads = 256;

unsigned blocks_for(int64_t items) { return static_cast<unsigned>((items + kThreads - 1) / kThreads); }

// Bits of a tile id (gsplat's floor(log2(T)) + 1): the padding tile id T fits too.
int tile_bits(int tiles) { return tiles > 0 ? 32 - __builtin_clz(static_cast<unsigned>(tiles)) : 1; }

int sort_end_bit(const BinParams& p) { return 32 + tile_bits(p.tiles_x * p.tiles_y); }

// Tiles [x0, x1) x [y0, y1) of TILE pixels covered by splat i, by gsplat 1.4's rule (isect_tiles.cu), casts
// included (dividing by a power of two is exact, as gsplat's division by its run-time tile_size).
template <int TILE>
struct TileRect {
  uint32_t x0, y0, x1, y1;
  __device__ TileRect(const BinParams& p, int i) {
    const float r = static_cast<float>(p.radii[i]) / static_cast<float>(TILE);
    const float tx = p.means2d[2 * i] / static_cast<float>(TILE);
    const float ty = p.means2d[2 * i + 1] / static_cast<float>(TILE);
    const uint32_t w = static_cast<uint32_t>(p.tiles_x), h = static_cast<uint32_t>(p.tiles_y);
    x0 = min(max(0u, static_cast<uint32_t>(floorf(tx - r))), w);
    y0 = min(max(0u, static_cast<uint32_t>(floorf(ty - r))), h);
    x1 = min(max(0u, static_cast<uint32_t>(ceilf(tx + r))), w);
    y1 = min(max(0u, static_cast<uint32_t>(ceilf(ty + r))), h);
  }
};

template <int TILE>
__global__ void count_kernel(const BinParams p) {
  const int i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (i >= p.n) return;
  if (p.radii[i] <= 0) {
    p.tiles_per[i] = 0;
    return;
  }
  const TileRect<TILE> t(p, i);
  p.tiles_per[i] = static_cast<int64_t>(t.y1 - t.y0) * static_cast<int64_t>(t.x1 - t.x0);
}

__global__ void total_kernel(const BinParams p) { *p.total = p.n > 0 ? p.ends[p.n - 1] : 0; }

template <int TILE>
__global__ void fill_kernel(const BinParams p) {
  const int i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (i >= p.n || p.radii[i] <= 0) return;
  int64_t at = p.ends[i] - p.tiles_per[i];
  if (at >= p.capacity) return;
  const TileRect<TILE> t(p, i);
  const int64_t depth = static_cast<int64_t>(__float_as_uint(p.depths[i]));
  for (uint32_t y = t.y0; y < t.y1; ++y) {
    for (uint32_t x = t.x0; x < t.x1; ++x, ++at) {
      if (at >= p.capacity) return;
      const int64_t tile = static_cast<int64_t>(y) * p.tiles_x + x;
      p.keys_unsorted[at] = (tile << 32) | depth;
      p.ids_unsorted[at] = i;
    }
  }
}

// Entries past the total sort last, in a tile of their own (id T); also writes `kept`.
__global__ void pad_kernel(const BinParams p) {
  const int64_t total = *p.total;
  const int64_t pad = (static_cast<int64_t>(p.tiles_x) * p.tiles_y << 32) | 0xffffffffll;
  for (int64_t k = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; k < p.capacity;
       k += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    if (k >= total) {
      p.keys_unsorted[k] = pad;
      p.ids_unsorted[k] = 0;
    }
  }
  if (blockIdx.x == 0 && threadIdx.x == 0) *p.kept = static_cast<int32_t>(min(total, int64_t{p.capacity}));
}

// offsets[t] = first entry of tile t (gsplat's isect_offset_encode; empty tiles start where the next begins).
__global__ void offsets_kernel(const BinParams p) {
  const int k = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (k >= p.capacity) return;
  const int64_t tiles = static_cast<int64_t>(p.tiles_x) * p.tiles_y;
  const int64_t tile = p.keys[k] >> 32;
  const int64_t prev = k == 0 ? -1 : p.keys[k - 1] >> 32;
  for (int64_t t = prev + 1; t <= min(tile, tiles - 1); ++t) p.offsets[t] = k;
  if (k == p.capacity - 1) {
    for (int64_t t = tile + 1; t < tiles; ++t) p.offsets[t] = p.capacity;
  }
}

}  // namespace

size_t count_tiles_temp_bytes(const BinParams& p) {
  size_t bytes = 0;
  if (p.n > 0) cub::DeviceScan::InclusiveSum(nullptr, bytes, p.tiles_per, p.ends, p.n);
  return bytes;
}

size_t fill_tiles_temp_bytes(const BinParams& p) {
  size_t bytes = 0;
  cub::DeviceRadixSort::SortPairs(nullptr, bytes, p.keys_unsorted, p.keys, p.ids_unsorted, p.ids, p.capacity, 0,
                                  sort_end_bit(p));
  return bytes;
}

cudaError_t launch_count_tiles(const BinParams& p, void* temp, size_t temp_bytes, cudaStream_t stream) {
  const cudaError_t side = with_tile_side(p.tile_size, cudaErrorInvalidValue, [&](auto tile) {
    if (p.n > 0) count_kernel<decltype(tile)::value><<<blocks_for(p.n), kThreads, 0, stream>>>(p);
    return cudaSuccess;
  });
  if (side != cudaSuccess) return side;
  if (p.n > 0) {
    const cudaError_t err = cub::DeviceScan::InclusiveSum(temp, temp_bytes, p.tiles_per, p.ends, p.n, stream);
    if (err != cudaSuccess) return err;
  }
  total_kernel<<<1, 1, 0, stream>>>(p);
  return cudaGetLastError();
}

cudaError_t launch_fill_tiles(const BinParams& p, void* temp, size_t temp_bytes, cudaStream_t stream) {
  if (p.capacity < 1) return cudaErrorInvalidValue;
  const cudaError_t side = with_tile_side(p.tile_size, cudaErrorInvalidValue, [&](auto tile) {
    if (p.n > 0) fill_kernel<decltype(tile)::value><<<blocks_for(p.n), kThreads, 0, stream>>>(p);
    return cudaSuccess;
  });
  if (side != cudaSuccess) return side;
  pad_kernel<<<min(blocks_for(p.capacity), 4096u), kThreads, 0, stream>>>(p);
  const cudaError_t err = cub::DeviceRadixSort::SortPairs(temp, temp_bytes, p.keys_unsorted, p.keys,
                                                          p.ids_unsorted, p.ids, p.capacity, 0, sort_end_bit(p),
                                                          stream);
  if (err != cudaSuccess) return err;
  offsets_kernel<<<blocks_for(p.capacity), kThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace bytesplat
