// Tile ranges with shared-memory-aware pruning: each tile's list [start, end) of gsplat's intersections, and
// where a list is longer than the fused kernel's on-chip capacity (and pruning is on), only the `capacity`
// splats that contribute most to that tile are kept, in depth order.
//
// Criterion (an estimate of the alpha mass a splat can put into the tile):
//   opacity * exp(-sigma at the point of the tile nearest the splat's centre) * min(2 pi sqrt(det cov2d), tile area)
// that is, the splat's peak alpha inside the tile times its footprint area (the integral of exp(-sigma) over
// the plane) capped at the tile's area. Ties at the threshold keep the front-most splats.
#pragma once

#include <cuda_runtime_api.h>

#include "raster_types.h"

namespace bytesplat {

struct PruneParams {
  const int32_t* offsets;  // [T] first entry of each tile (gsplat's isect offsets)
  int32_t* ids;            // [M] splat index per entry; rewritten in place where a tile is pruned
  int n_entries;           // M
  const int32_t* kept;     // [1] entries in use, the end of the last tile (sync-free binning), or null: M
  SplatInputs splats;      // means2d, conics, opacities (colours unused)
  int tiles_x;
  int tiles_y;
  int tile_size;      // tile side in pixels: kTileLarge or kTileSmall
  int capacity;       // keep at most this many per tile; <= 0: no pruning
  int32_t* tile_end;  // [T] out: one past the last kept entry
  int32_t* pruned;    // [1] += entries dropped
};

cudaError_t launch_prune_tiles(const PruneParams& p, cudaStream_t stream);

}  // namespace bytesplat

#ifndef __CUDACC__
#include "common.h"

namespace bytesplat {

// -> (tile_end [T] int32, pruned [1] int32). flatten_ids is rewritten in place for pruned tiles.
std::tuple<at::Tensor, at::Tensor> tile_ranges(const at::Tensor& offsets,  // [T] int32
                                               at::Tensor flatten_ids,     // [M] int32
                                               const at::Tensor& means2d,  // [N, 2]
                                               const at::Tensor& conics,   // [N, 3]
                                               const at::Tensor& opacities,  // [N]
                                               const c10::optional<at::Tensor>& kept,  // [1] int32 or none
                                               int64_t tiles_x, int64_t tile_size, int64_t capacity);

}  // namespace bytesplat
#endif
