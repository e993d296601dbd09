// Tile ranges and on-chip pruning. One block per tile; tiles that fit only write their end. An overflowing
// tile selects its `capacity` highest-scoring entries by a radix select on the score's bits (scores are
// non-negative floats, so their bit patterns sort as unsigned integers), then compacts them in place, stably
// (depth order kept), with block-wide prefix sums. Instantiated for 16- and 8-pixel tiles (raster_types.h): one
// thread per pixel of the tile, as the rasterization kernels.
#include "prune_tiles.h"
#include "raster_device.cuh"

namespace bytesplat {
namespace {

constexpr float kTwoPi = 6.283185307179586f;

template <int TILE>
__device__ __forceinline__ uint32_t score_key(const SplatInputs& s, int32_t id, float x0, float y0) {
  const int64_t n = id;
  const float mx = s.means2d[2 * n], my = s.means2d[2 * n + 1];
  const float a = s.conics[3 * n], b = s.conics[3 * n + 1], c = s.conics[3 * n + 2];
  const float dx = mx - fminf(fmaxf(mx, x0), x0 + TILE);  // centre minus the nearest point of the tile
  const float dy = my - fminf(fmaxf(my, y0), y0 + TILE);
  const float sigma = 0.5f * (a * dx * dx + c * dy * dy) + b * dx * dy;
  const float area = fminf(kTwoPi * rsqrtf(fmaxf(a * c - b * b, 1e-30f)), static_cast<float>(TILE * TILE));
  const float score = fmaxf(s.opacities[n] * expf(-fmaxf(sigma, 0.f)) * area, 0.f);  // NaN -> 0
  return __float_as_uint(score);
}

// Exclusive prefix count of `flag` over the block of kWarps warps; `total` gets the block's count. Holds two
// barriers.
template <int kWarps>
__device__ __forceinline__ int block_scan(bool flag, int* warp_counts, int& total) {
  const int lane = static_cast<int>(threadIdx.x) & 31, warp = static_cast<int>(threadIdx.x) >> 5;
  const unsigned bits = __ballot_sync(kFullMask, flag);
  if (lane == 0) warp_counts[warp] = __popc(bits);
  __syncthreads();
  int before = 0;
  total = 0;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) {
    before += w < warp ? warp_counts[w] : 0;
    total += warp_counts[w];
  }
  __syncthreads();
  return before + __popc(bits & ((1u << lane) - 1u));
}

template <int TILE>
__global__ void __launch_bounds__(TileShape<TILE>::kBlock) prune_kernel(const PruneParams p) {
  constexpr int kBlock = TileShape<TILE>::kBlock;
  constexpr int kWarps = TileShape<TILE>::kWarps;
  __shared__ uint32_t hist[256];  // one bin per 8-bit digit (cleared by kBlock threads, 256 or 64)
  __shared__ uint32_t s_prefix;
  __shared__ int s_need;
  __shared__ int warp_counts[kWarps];

  const int tile = static_cast<int>(blockIdx.x);
  const int n_tiles = p.tiles_x * p.tiles_y;
  const int first = p.offsets[tile];
  const int end = tile + 1 < n_tiles ? p.offsets[tile + 1] : (p.kept != nullptr ? *p.kept : p.n_entries);
  const int count = end - first;
  if (p.capacity <= 0 || count <= p.capacity) {
    if (threadIdx.x == 0) p.tile_end[tile] = end;
    return;
  }
  const float x0 = static_cast<float>((tile % p.tiles_x) * TILE);
  const float y0 = static_cast<float>((tile / p.tiles_x) * TILE);

  // Radix select, 8 bits at a time from the top: the key of the capacity-th largest score (`prefix`) and how
  // many entries with exactly that key to keep (`need`).
  uint32_t prefix = 0, mask = 0;
  int need = p.capacity;
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int i = static_cast<int>(threadIdx.x); i < 256; i += kBlock) hist[i] = 0;
    __syncthreads();
    for (int i = static_cast<int>(threadIdx.x); i < count; i += kBlock) {
      const uint32_t key = score_key<TILE>(p.splats, p.ids[first + i], x0, y0);
      if ((key & mask) == prefix) atomicAdd(&hist[(key >> shift) & 255u], 1u);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      int above = 0;
      for (int digit = 255; digit >= 0; --digit) {
        const int here = static_cast<int>(hist[digit]);
        if (above + here >= need) {
          s_prefix = prefix | (static_cast<uint32_t>(digit) << shift);
          s_need = need - above;
          break;
        }
        above += here;
      }
    }
    __syncthreads();
    prefix = s_prefix;
    need = s_need;
    mask |= 255u << shift;
  }

  // Stable in-place compaction: keep keys above the threshold and the first `need` equal to it.
  int kept = 0, equal_seen = 0;
  for (int base = 0; base < count; base += kBlock) {
    const int i = base + static_cast<int>(threadIdx.x);
    const bool valid = i < count;
    const int32_t id = valid ? p.ids[first + i] : 0;
    const uint32_t key = valid ? score_key<TILE>(p.splats, id, x0, y0) : 0u;
    int n_equal = 0, n_keep = 0;
    const bool equal = valid && key == prefix;
    const int equal_rank = equal_seen + block_scan<kWarps>(equal, warp_counts, n_equal);
    const bool keep = (valid && key > prefix) || (equal && equal_rank < need);
    const int slot = kept + block_scan<kWarps>(keep, warp_counts, n_keep);
    if (keep) p.ids[first + slot] = id;  // slot <= i: only entries already read are overwritten
    kept += n_keep;
    equal_seen += n_equal;
  }
  if (threadIdx.x == 0) {
    p.tile_end[tile] = first + kept;
    atomicAdd(p.pruned, count - kept);
  }
}

}  // namespace

cudaError_t launch_prune_tiles(const PruneParams& p, cudaStream_t stream) {
  const unsigned blocks = static_cast<unsigned>(p.tiles_x) * static_cast<unsigned>(p.tiles_y);
  if (blocks == 0) return cudaSuccess;
  return with_tile_side(p.tile_size, cudaErrorInvalidValue, [&](auto tile) {
    constexpr int kTile = decltype(tile)::value;
    prune_kernel<kTile><<<blocks, TileShape<kTile>::kBlock, 0, stream>>>(p);
    return cudaGetLastError();
  });
}

}  // namespace bytesplat
