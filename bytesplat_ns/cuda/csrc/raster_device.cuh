// Device helpers shared by the rasterization kernels: gsplat's per-pixel alpha rules (evaluated in base 2), the test
// of which splats can reach a warp's rows, the on-chip splat cache, compositing and warp reductions. Plain CUDA (no
// torch headers).
#pragma once

#include <cuda_runtime.h>

#include "raster_types.h"

namespace bytesplat {

constexpr float kAlphaMin = 1.0f / 255.0f;  // a splat counts for a pixel when alpha >= this
constexpr float kAlphaMax = 0.999f;         // alpha = min(kAlphaMax, opacity * exp(-sigma))
constexpr float kTransmitMin = 1e-4f;       // a pixel stops before the splat taking T to this or below
constexpr unsigned kFullMask = 0xffffffffu;

constexpr float kLog2e = 1.4426950408889634f;  // log2(e): exp(x) = 2^(x log2(e))
constexpr float kLn2 = 0.6931471805599453f;    // ln(2)

// 2^x by the hardware's approximation with denormals flushed (ex2.approx.ftz, relative error ~2^-22): one
// instruction, where exp2f / __expf without -ftz add a range check and a rescale for tiny results. A flushed
// result is below 2^-126, far under the alpha cut-off, so no pixel's outcome changes.
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// 1 / x by the hardware's approximation (rcp.approx.ftz): x is never denormal where it is used (1 - alpha >= 0.001).
__device__ __forceinline__ float fast_rcp(float x) {
  float y;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// A cached splat's falloff in base 2: the splat offers a pixel at offset (dx, dy) from its centre
// vis = exp(-sigma) = 2^power, power = qa dx^2 + qb dx dy + qc dy^2, where (qa, qb, qc) = -(a / 2, b, c / 2) log2(e)
// for the conic [[a, b], [b, c]] (sigma = a dx^2 / 2 + b dx dy + c dy^2 / 2). Precomputed when the splat is cached.
struct Falloff {
  float qa, qb, qc;
  __host__ __device__ static Falloff of_conic(float a, float b, float c) {
    return {-0.5f * kLog2e * a, -kLog2e * b, -0.5f * kLog2e * c};
  }
};

// Whether a splat counts for the pixel centre (px, py) by gsplat's rules (sigma >= 0, alpha >= 1/255), with its
// alpha = min(kAlphaMax, opacity vis). dx, dy (centre minus pixel), t = qa dx + qb dy and vis = exp(-sigma) are
// returned for the backward pass. `geo` = (x, y, qa, qb), `geo2` = (qc, opacity, ...), as SplatCache keeps them.
__device__ __forceinline__ bool splat_alpha(float4 geo, float4 geo2, float px, float py, float& dx, float& dy,
                                            float& t, float& vis, float& alpha) {
  dx = geo.x - px;
  dy = geo.y - py;
  t = fmaf(geo.z, dx, geo.w * dy);
  const float power = fmaf(geo2.x * dy, dy, dx * t);  // -sigma log2(e)
  vis = fast_exp2(power);
  alpha = fminf(kAlphaMax, geo2.y * vis);
  return power <= 0.f && alpha >= kAlphaMin;
}

// The pixels of a tile that one warp covers: 32 / TILE full-width rows (2 of 16 pixels or 4 of 8), as pixel centres.
template <int TILE>
struct WarpRect {
  static constexpr int kRows = 32 / TILE;
  float x_lo, x_hi;  // first and last column
  float y0;          // first row (the others follow 1 apart)

  __device__ WarpRect(int tile, int tiles_x) {
    x_lo = static_cast<float>((tile % tiles_x) * TILE) + 0.5f;
    x_hi = x_lo + static_cast<float>(TILE - 1);
    y0 = static_cast<float>((tile / tiles_x) * TILE + (static_cast<int>(threadIdx.x) >> 5) * kRows) + 0.5f;
  }

  // Whether a splat (geo, geo2 as SplatCache keeps them) may reach alpha >= kAlphaMin somewhere on these rows: its
  // largest power over each row's segment (concave in dx where qa < 0: the vertex, clamped to the segment), with
  // slack for rounding: 1e-3 plus 1e-6 of the largest size the power's terms take on the row, where the per-pixel
  // evaluation and this one each err by under 3e-7 of it. A splat with qa >= 0 is never ruled out.
  __device__ bool may_reach(float4 geo, float4 geo2) const {
    if (!(geo.z < 0.f)) return true;
    const float k = -0.5f * geo.w * fast_rcp(geo.z);  // the power's vertex in dx for a row at offset dy: k dy
    const float dx_min = geo.x - x_hi, dx_max = geo.x - x_lo;
    const float dx_far = fmaxf(fabsf(dx_min), fabsf(dx_max));
    const float size_a = -geo.z * dx_far * dx_far, size_b = fabsf(geo.w) * dx_far;  // |qa| dx^2, |qb dx| bounds
    float best = -__int_as_float(0x7f800000);
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      const float dy = geo.y - (y0 + static_cast<float>(r));
      const float dx = fminf(fmaxf(k * dy, dx_min), dx_max);
      const float power = fmaf(fmaf(geo.z, dx, geo.w * dy), dx, geo2.x * dy * dy);
      const float size = fmaf(size_b, fabsf(dy), fmaf(fabsf(geo2.x) * dy, dy, size_a));
      best = fmaxf(best, fmaf(1e-6f, size, power));
    }
    return geo2.y * fast_exp2(best + 1e-3f) >= kAlphaMin;
  }
};

// Splats of one tile (or one chunk of it) in shared memory, structure of arrays, in 16-byte rows where it can: the
// first two colour channels ride in geo2's spare half, so a splat is read with two 16-byte loads and CDIM - 2 single
// floats. The tile list's ids stay in device memory: only the backward's final atomicAdds need them.
template <int CDIM>
struct SplatCache {
  static_assert(CDIM >= 2, "two colour channels ride in geo2");
  static constexpr int kRest = CDIM - 2;
  static constexpr int kBytesPerSplat = 16 + 16 + 4 * kRest;  // geo, geo2, the other channels

  float4* geo;   // (x, y, qa, qb): centre and falloff (Falloff)
  float4* geo2;  // (qc, opacity, colour 0, colour 1)
  float* rest;   // [capacity, kRest]: colour 2 ..

  // Lays the arrays out from `base` (16-byte aligned) for `capacity` splats.
  __device__ static SplatCache carve(unsigned char* base, int capacity) {
    SplatCache c;
    c.geo = reinterpret_cast<float4*>(base);
    base += sizeof(float4) * capacity;
    c.geo2 = reinterpret_cast<float4*>(base);
    base += sizeof(float4) * capacity;
    c.rest = reinterpret_cast<float*>(base);
    return c;
  }

  // Colour of cached splat j, whose geo2 the caller has read.
  __device__ __forceinline__ void colour(int j, float4 g2, float (&c)[CDIM]) const {
    c[0] = g2.z;
    c[1] = g2.w;
#pragma unroll
    for (int d = 0; d < kRest; ++d) c[2 + d] = rest[kRest * j + d];
  }

  // Cooperative load of entries [first, first + count) of the tile lists' id array into slots [at, at + count).
  __device__ void load(const SplatInputs& s, const int32_t* list_ids, int first, int count, int at = 0) const {
    for (int i = threadIdx.x; i < count; i += blockDim.x) {
      const int64_t n = list_ids[first + i];
      const int k = at + i;
      const Falloff f = Falloff::of_conic(s.conics[3 * n], s.conics[3 * n + 1], s.conics[3 * n + 2]);
      geo[k] = make_float4(s.means2d[2 * n], s.means2d[2 * n + 1], f.qa, f.qb);
      geo2[k] = make_float4(f.qc, s.opacities[n], s.colors[CDIM * n], s.colors[CDIM * n + 1]);
#pragma unroll
      for (int d = 0; d < kRest; ++d) rest[kRest * k + d] = s.colors[CDIM * n + 2 + d];
    }
  }
};

// Front-to-back compositing into one pixel (transmittance T, colour C) of cached slots j0 .. j0 + n - 1 (n <= 32),
// a word of splats, stopping before the splat that would take T to kTransmitMin or below (then `done` is set).
// First a ballot keeps the splats that may count on some pixel of the warp's rows (each lane tests one, r.may_reach),
// then each pixel not yet done composites only those. Returns a bit per splat this pixel composited (bit t: slot
// j0 + t). Call with the whole warp.
template <int TILE, int CDIM>
__device__ __forceinline__ uint32_t composite_word(const SplatCache<CDIM>& c, int j0, int n, const WarpRect<TILE>& r,
                                                   float px, float py, float& T, float (&C)[CDIM], bool& done) {
  const int lane = static_cast<int>(threadIdx.x) & 31;
  uint32_t todo = __ballot_sync(kFullMask, lane < n && r.may_reach(c.geo[j0 + lane], c.geo2[j0 + lane]));
  if (done) return 0u;
  uint32_t used = 0u;
  while (todo != 0u) {
    const int t = __ffs(todo) - 1;  // front to back
    todo &= todo - 1u;
    const int j = j0 + t;
    float dx, dy, tq, vis, alpha;
    const float4 g2 = c.geo2[j];
    if (!splat_alpha(c.geo[j], g2, px, py, dx, dy, tq, vis, alpha)) continue;
    const float next_T = T * (1.f - alpha);
    if (next_T <= kTransmitMin) {
      done = true;
      break;
    }
    const float w = alpha * T;
    float col[CDIM];
    c.colour(j, g2, col);
#pragma unroll
    for (int d = 0; d < CDIM; ++d) C[d] += w * col[d];
    T = next_T;
    used |= 1u << t;
  }
  return used;
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(kFullMask, v, o);
  return v;
}

// One reduce-scatter step over lane bit `bit` on a[0, M): lanes that differ in `bit` swap parts and each keeps the sum
// of one part in a[0, H), H = ceil(M / 2): the lane with `bit` clear keeps a[0, H), the other a[H, M) (padded with a
// zero where M is odd).
template <int M>
__device__ __forceinline__ void fold_halves(float* a, int lane, int bit) {
  constexpr int H = (M + 1) / 2;
  const bool upper = (lane & bit) != 0;
#pragma unroll
  for (int i = 0; i < H; ++i) {
    const float hi = i + H < M ? a[i + H] : 0.f;
    const float send = upper ? a[i] : hi;
    const float keep = upper ? hi : a[i];
    a[i] = keep + __shfl_xor_sync(kFullMask, send, bit);
  }
}

// Sums each of K <= 16 values over the warp by a reduce-scatter over lane bits 16, 8, 4, 2 (parts of ceil(K / 2),
// then half of that, ...: 13 shuffles for K = 11 or 12, where K warp_sums take 5 K), then one exchange over bit 1.
// Returns the warp's sum of value scattered_index<K>(lane), the same on lanes l and l ^ 1 (unused where it is -1).
template <int K>
__device__ __forceinline__ float warp_sum_scattered(const float (&v)[K], int lane) {
  static_assert(K >= 1 && K <= 16, "four halvings leave one value for at most 16");
  constexpr int M1 = (K + 1) / 2, M2 = (M1 + 1) / 2, M3 = (M2 + 1) / 2;
  float a[K];
#pragma unroll
  for (int i = 0; i < K; ++i) a[i] = v[i];
  fold_halves<K>(a, lane, 16);
  fold_halves<M1>(a, lane, 8);
  fold_halves<M2>(a, lane, 4);
  fold_halves<M3>(a, lane, 2);
  return a[0] + __shfl_xor_sync(kFullMask, a[0], 1);
}

// Which of the K values warp_sum_scattered leaves on `lane`, or -1 for a padding slot: the parts each halving keeps,
// followed through lane bits 16, 8, 4, 2.
template <int K>
__device__ __forceinline__ int scattered_index(int lane) {
  int lo = 0, size = K, m = K;  // this lane's part: values lo .. lo + size - 1 in a window of m slots
#pragma unroll
  for (int bit = 16; bit >= 2; bit >>= 1) {
    const int h = (m + 1) / 2;
    if (lane & bit) {
      lo += h;
      size = max(0, size - h);
    } else {
      size = min(size, h);
    }
    m = h;
  }
  return size > 0 ? lo : -1;
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
