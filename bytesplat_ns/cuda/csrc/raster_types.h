// Plain structs shared by the host wrappers (.cpp) and the kernels (.cu): raw pointers only, no torch.
#pragma once

#include <cstdint>
#include <type_traits>

#ifdef __CUDACC__
#define BYTESPLAT_HOST_DEVICE __host__ __device__
#else
#define BYTESPLAT_HOST_DEVICE
#endif

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

// What the forward kernel keeps for a backward that resumes from it instead of compositing each tile again: the
// passes whose pixel gradients need the whole image first (the D-SSIM term, autograd). All null: nothing kept.
struct PassState {
  float* render;         // [H, W, CDIM] premultiplied colour, no background (the forward's render output)
  float* transmittance;  // [H, W] final transmittance
  int32_t* last;         // [H, W] index in its tile's list of the last splat composited into the pixel (-1: none)
  uint32_t* bits;        // [pass_bits_size] per tile, warp and list entry: whether a pixel of the warp composited it
};

// Where PassState::bits keeps the contribution bits of entries [32 word, 32 word + 32) of tile `tile`'s list (which
// starts at entry `start`) for warp `warp` of `warps`. Tile t's words begin at start[t] / 32 + t, so no two tiles
// share a word however their lists fall.
BYTESPLAT_HOST_DEVICE inline int64_t pass_bits_index(int start, int tile, int word, int warp, int warps) {
  return (static_cast<int64_t>(start / 32 + tile) + word) * warps + warp;
}

// Words of PassState::bits for the tile lists `t` in an ids buffer of `entries` entries (host side).
inline int64_t pass_bits_size(const TileLists& t, int64_t entries) {
  const int64_t warps = int64_t{t.tile_size} * t.tile_size / 32;
  return (entries / 32 + int64_t{t.tiles_x} * t.tiles_y + 1) * warps;
}

}  // namespace bytesplat
