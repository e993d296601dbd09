// Tile binning without a host sync: which splats touch which tile (16x16 or 8x8 pixels), each tile's entries
// front to back, into buffers of a capacity chosen beforehand. gsplat's isect_tiles reads the entry count back to
// the host to size its buffers, so the host waits for the GPU there every step; here the host never reads it.
//
// Entries and their order are gsplat's (isect_tiles + isect_offset_encode, one camera): a splat with radius r
// covers the tiles its square (centre +- r) overlaps; key = tile id << 32 | the depth's float bits; a stable
// radix sort by key. Entries are written in splat order, so with a capacity below the count (an overflow) the
// entries of the last splats are dropped; `total` tells the caller (who reads it a few steps later).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace bytesplat {

struct BinParams {
  const float* means2d;  // [N, 2] pixel centres
  const int32_t* radii;  // [N] screen radius in pixels, <= 0 for culled splats
  const float* depths;   // [N] camera-space z (positive for every splat with a radius)
  int n;
  int tiles_x;
  int tiles_y;
  int tile_size;            // tile side in pixels: kTileLarge or kTileSmall (raster_types.h)
  int capacity;             // entries the buffers hold (>= 1)
  int64_t* tiles_per;       // [N] scratch: tiles each splat covers
  int64_t* ends;            // [N] scratch: inclusive prefix sum of tiles_per
  int64_t* keys_unsorted;   // [capacity] scratch
  int32_t* ids_unsorted;    // [capacity] scratch
  int64_t* keys;            // [capacity] out: sorted keys; entries past `kept` hold (T << 32 | 0xffffffff)
  int32_t* ids;             // [capacity] out: splat index per sorted entry
  int32_t* offsets;         // [T] out: first entry of each tile (gsplat's isect offsets)
  int32_t* kept;            // [1] out: min(total, capacity), the end of the last tile
  int64_t* total;           // [1] out: entries the splats make (more than `capacity` on an overflow)
};

// Scratch bytes of the first pass's prefix sum over p.n splats, and of the second pass's sort of p.capacity keys.
size_t count_tiles_temp_bytes(const BinParams& p);
size_t fill_tiles_temp_bytes(const BinParams& p);

// First pass: tiles_per, ends and total.
cudaError_t launch_count_tiles(const BinParams& p, void* temp, size_t temp_bytes, cudaStream_t stream);

// Second pass (after the first): the entries, sorted, the tile offsets and kept.
cudaError_t launch_fill_tiles(const BinParams& p, void* temp, size_t temp_bytes, cudaStream_t stream);

}  // namespace bytesplat

#ifndef __CUDACC__
#include "common.h"

namespace bytesplat {

// -> (keys [C] int64, ids [C] int32, offsets [T] int32, kept [1] int32, total [1] int64), C = capacity, or the
// exact count when capacity < 0 (then the host waits for the count: one sync).
std::vector<at::Tensor> bin_tiles(const at::Tensor& means2d,  // [N, 2] float32
                                  const at::Tensor& radii,    // [N] int32
                                  const at::Tensor& depths,   // [N] float32
                                  int64_t tiles_x, int64_t tiles_y, int64_t tile_size, int64_t capacity);

}  // namespace bytesplat
#endif
