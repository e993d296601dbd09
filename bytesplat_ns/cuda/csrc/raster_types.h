// Plain structs shared by the host wrappers (.cpp) and the kernels (.cu): raw pointers only, no torch.
#pragma once

#include <cstdint>

namespace bytesplat {

constexpr int kTile = 16;              // tile side in pixels
constexpr int kBlock = kTile * kTile;  // threads per block: one pixel each
constexpr int kWarps = kBlock / 32;

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
