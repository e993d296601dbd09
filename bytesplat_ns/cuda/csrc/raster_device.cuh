// Device helpers shared by the rasterization kernels: gsplat's per-pixel alpha rules, the on-chip splat
// cache and warp reductions. Plain CUDA (no torch headers).
#pragma once

#include <cuda_runtime.h>

#include "raster_types.h"

namespace bytesplat {

constexpr float kAlphaMin = 1.0f / 255.0f;  // a splat counts for a pixel when alpha >= this
constexpr float kAlphaMax = 0.999f;         // alpha = min(kAlphaMax, opacity * exp(-sigma))
constexpr float kTransmitMin = 1e-4f;       // a pixel stops before the splat taking T to this or below
constexpr unsigned kFullMask = 0xffffffffu;

// Alpha that a splat offers the pixel centre (px, py); 0 when gsplat's rules skip it there.
// dx, dy (centre minus pixel) and vis = exp(-sigma) are returned for the backward pass. The fast exp (__expf,
// relative error ~1e-6 here) is gsplat's: it builds with --use_fast_math.
__device__ __forceinline__ float splat_alpha(float2 xy, float3 con, float opac, float px, float py, float& dx,
                                             float& dy, float& vis) {
  dx = xy.x - px;
  dy = xy.y - py;
  const float sigma = 0.5f * (con.x * dx * dx + con.z * dy * dy) + con.y * dx * dy;
  vis = __expf(-sigma);
  const float alpha = fminf(kAlphaMax, opac * vis);
  return (sigma < 0.f || alpha < kAlphaMin) ? 0.f : alpha;
}

// Splats of one tile (or one chunk of it) in shared memory, structure of arrays.
template <int CDIM>
struct SplatCache {
  static constexpr int kBytesPerSplat = 8 + 12 + 4 + 4 * CDIM + 4;  // xy, conic, opacity, colour, id

  float2* xy;
  float3* con;
  float* opac;
  float* col;  // [capacity, CDIM]
  int32_t* ids;

  // Lays the arrays out from `base` (16-byte aligned) for `capacity` splats.
  __device__ static SplatCache carve(unsigned char* base, int capacity) {
    SplatCache c;
    c.xy = reinterpret_cast<float2*>(base);
    base += sizeof(float2) * capacity;
    c.con = reinterpret_cast<float3*>(base);
    base += sizeof(float3) * capacity;
    c.opac = reinterpret_cast<float*>(base);
    base += sizeof(float) * capacity;
    c.col = reinterpret_cast<float*>(base);
    base += sizeof(float) * CDIM * capacity;
    c.ids = reinterpret_cast<int32_t*>(base);
    return c;
  }

  // Cooperative load of entries [first, first + count) of the tile lists' id array into slots [at, at + count).
  __device__ void load(const SplatInputs& s, const int32_t* list_ids, int first, int count, int at = 0) const {
    for (int i = threadIdx.x; i < count; i += blockDim.x) {
      const int32_t id = list_ids[first + i];
      const int64_t n = id;
      const int k = at + i;
      ids[k] = id;
      xy[k] = make_float2(s.means2d[2 * n], s.means2d[2 * n + 1]);
      con[k] = make_float3(s.conics[3 * n], s.conics[3 * n + 1], s.conics[3 * n + 2]);
      opac[k] = s.opacities[n];
#pragma unroll
      for (int d = 0; d < CDIM; ++d) col[CDIM * k + d] = s.colors[CDIM * n + d];
    }
  }
};

enum class Step { kSkip, kUsed, kStop };

// Front-to-back compositing of cached splat j into one pixel (transmittance T, colour C).
template <int CDIM>
__device__ __forceinline__ Step composite_one(const SplatCache<CDIM>& c, int j, float px, float py, float& T,
                                              float (&C)[CDIM]) {
  float dx, dy, vis;
  const float alpha = splat_alpha(c.xy[j], c.con[j], c.opac[j], px, py, dx, dy, vis);
  if (alpha == 0.f) return Step::kSkip;
  const float next_T = T * (1.f - alpha);
  if (next_T <= kTransmitMin) return Step::kStop;
  const float w = alpha * T;
#pragma unroll
  for (int d = 0; d < CDIM; ++d) C[d] += w * c.col[CDIM * j + d];
  T = next_T;
  return Step::kUsed;
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(kFullMask, v, o);
  return v;
}

// One reduce-scatter step: lanes that differ in `bit` swap halves of a[0, 2N) and each keeps the sum of one half
// in a[0, N) (the lane with `bit` set keeps the upper half).
template <int N>
__device__ __forceinline__ void fold_halves(float* a, int lane, int bit) {
  const bool upper = (lane & bit) != 0;
#pragma unroll
  for (int i = 0; i < N; ++i) {
    const float send = upper ? a[i] : a[i + N];
    const float keep = upper ? a[i + N] : a[i];
    a[i] = keep + __shfl_xor_sync(kFullMask, send, bit);
  }
}

// Sums each of K <= 16 values over the warp with 16 shuffles (K warp_sums take 5 K): a reduce-scatter over lane
// bits 16, 8, 4, 2, then one exchange over bit 1. Returns the warp's sum of value scattered_index(lane), the same
// on lanes l and l ^ 1; lanes whose index is >= K return 0.
template <int K>
__device__ __forceinline__ float warp_sum_scattered(const float (&v)[K], int lane) {
  static_assert(K <= 16, "at most 16 values");
  float a[16];
#pragma unroll
  for (int i = 0; i < 16; ++i) a[i] = i < K ? v[i] : 0.f;
  fold_halves<8>(a, lane, 16);
  fold_halves<4>(a, lane, 8);
  fold_halves<2>(a, lane, 4);
  fold_halves<1>(a, lane, 2);
  return a[0] + __shfl_xor_sync(kFullMask, a[0], 1);
}

// Which value warp_sum_scattered leaves on `lane`: lane bits 16, 8, 4, 2 select halves of 8, 4, 2, 1.
__device__ __forceinline__ int scattered_index(int lane) {
  return ((lane >> 4) & 1) * 8 + ((lane >> 3) & 1) * 4 + ((lane >> 2) & 1) * 2 + ((lane >> 1) & 1);
}

__device__ __forceinline__ int warp_max(int v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = max(v, __shfl_xor_sync(kFullMask, v, o));
  return v;
}

// Pixel of this thread in tile `tile`: row-major TILE x TILE, centre at +0.5.
template <int TILE>
struct PixelCoord {
  int x, y;
  bool inside;
  int index;  // y * width + x (0 outside the image)
  __device__ PixelCoord(int tile, int tiles_x, int width, int height) {
    x = (tile % tiles_x) * TILE + static_cast<int>(threadIdx.x) % TILE;
    y = (tile / tiles_x) * TILE + static_cast<int>(threadIdx.x) / TILE;
    inside = x < width && y < height;
    index = inside ? y * width + x : 0;
  }
};

}  // namespace bytesplat
