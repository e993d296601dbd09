// Plain structs shared by the host wrappers (.cpp) and the kernels (.cu): raw pointers only, no torch.
#pragma once

#include <cstdint>
#include <type_traits>

namespace bytesplat {

// The tile sides the kernels are instantiated for: 16 by default, 8 for images with fewer 16-pixel tiles than two
// waves of blocks (bytesplat_ns/cuda/ops.py, tile_size_for). A block covers one tile, one thread per pixel.
constexpr int kTileLarge = 16;
constexpr int kTileSmall = 8;

template <int TILE>
struct TileShape {
  static_assert(TILE == kTileLarge || TILE == kTileSmall, "the kernels are instantiated for 16- and 8-pixel tiles");
  static constexpr int kTile = TILE;          // tile side in pixels
  static constexpr int kBlock = TILE * TILE;  // threads per block: one pixel each (256 or 64)
  static constexpr int kWarps = kBlock / 32;  // 8 or 2
  static_assert(kBlock % 32 == 0, "whole warps: the kernels vote and shuffle over full warps");
};

// The one place a run-time tile side picks the kernels' instantiation: f(std::integral_constant<int, TILE>{}) for
// tile_size 16 or 8, `otherwise` for any other side.
template <typename R, typename F>
R with_tile_side(int tile_size, R otherwise, F&& f) {
  if (tile_size == kTileLarge) return f(std::integral_constant<int, kTileLarge>{});
  if (tile_size == kTileSmall) return f(std::integral_constant<int, kTileSmall>{});
  return otherwise;
}

// Projected splats of one camera, as gsplat's projection and SH kernels return them.
struct SplatInputs {
  const float* means2d;    // [N, 2] pixel centres
  const float* conics;     // [N, 3] inverse 2D covariance (a, b, c) of [[a, b], [b, c]]
  const float* colors;     // [N, CDIM]
  const float* opacities;  // [N]
};

// Each tile's splats, front to back: entries ids[start[t] .. end[t]) of tile t (row-major tiles).
struct TileLists {
  const int32_t* start;  // [T]
  const int32_t* end;    // [T]
  const int32_t* ids;    // [M] splat index per entry
  int tiles_x;
  int tiles_y;
  int tile_size;         // tile side in pixels: kTileLarge or kTileSmall
};

// Per-splat gradient accumulators (zero-initialised; one atomicAdd per splat, tile and quantity).
struct SplatGrads {
  float* means2d;      // [N, 2]
  float* means2d_abs;  // [N, 2] sum over pixels of |per-pixel means2d gradient|, or null
  float* conics;       // [N, 3]
  float* colors;       // [N, CDIM]
  float* opacities;    // [N]
};

}  // namespace bytesplat
