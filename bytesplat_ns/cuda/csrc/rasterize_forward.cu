// Forward kernel: one block per tile, one thread per pixel; the tile's splats pass through shared memory in
// batches of kBlock, front to back, with gsplat's cut-offs (raster_device.cuh); each warp composites, a word of 32
// at a time, only the splats that can reach its rows. Instantiated for 16- and 8-pixel tiles (raster_types.h).
// When asked to keep its state (p.keep), it also writes what a backward needs to resume without compositing again:
// each pixel's final transmittance and last composited entry, and each warp's contribution bits, a word per 32
// entries it walked (words past a warp's last composited entry may be left unwritten: readers ignore them).
#include "raster_device.cuh"
#include "rasterize_forward.h"

namespace bytesplat {
namespace {

template <int TILE, int CDIM>
__global__ void __launch_bounds__(TileShape<TILE>::kBlock) forward_kernel(const ForwardParams p) {
  constexpr int kBlock = TileShape<TILE>::kBlock;
  constexpr int kWarps = TileShape<TILE>::kWarps;
  __shared__ __align__(16) unsigned char smem[kBlock * SplatCache<CDIM>::kBytesPerSplat];
  const SplatCache<CDIM> cache = SplatCache<CDIM>::carve(smem, kBlock);

  const int tile = static_cast<int>(blockIdx.x);
  const PixelCoord<TILE> pix(tile, p.tiles.tiles_x, p.width, p.height);
  const float px = static_cast<float>(pix.x) + 0.5f;
  const float py = static_cast<float>(pix.y) + 0.5f;
  const WarpRect<TILE> rect(tile, p.tiles.tiles_x);
  const int first = p.tiles.start[tile];
  const int count = p.tiles.end[tile] - first;

  float T = 1.f;
  float C[CDIM];
#pragma unroll
  for (int d = 0; d < CDIM; ++d) C[d] = 0.f;
  bool done = !pix.inside;
  const bool keep = p.keep.transmittance != nullptr;
  int last = -1;  // index in the tile's list of the last splat composited into this pixel (kept only)
  for (int off = 0; off < count; off += kBlock) {
    // Also the barrier before the cache is overwritten.
    if (__syncthreads_count(done) == kBlock) break;
    const int len = min(kBlock, count - off);
    cache.load(p.splats, p.tiles.ids, first + off, len);
    __syncthreads();
    for (int j = 0; j < len; j += 32) {  // a word of 32 splats at a time, the warp together (it votes)
      if (__all_sync(kFullMask, done)) break;
      const uint32_t mine = composite_word<TILE, CDIM>(cache, j, min(32, len - j), rect, px, py, T, C, done);
      if (keep) {
        if (mine != 0u) last = off + j + 31 - __clz(mine);
        const uint32_t word = __reduce_or_sync(kFullMask, mine);
        const int warp = static_cast<int>(threadIdx.x) >> 5;
        if ((threadIdx.x & 31) == 0) p.keep.bits[pass_bits_index(first, tile, (off + j) >> 5, warp, kWarps)] = word;
      }
    }
  }
  if (!pix.inside) return;
#pragma unroll
  for (int d = 0; d < CDIM; ++d) p.render[static_cast<int64_t>(CDIM) * pix.index + d] = C[d];
  p.alpha[pix.index] = 1.f - T;
  if (keep) {
    p.keep.transmittance[pix.index] = T;
    p.keep.last[pix.index] = last;
  }
}

template <int TILE>
cudaError_t launch(const ForwardParams& p, int cdim, unsigned blocks, cudaStream_t stream) {
  switch (cdim) {
    case 3:
      forward_kernel<TILE, 3><<<blocks, TileShape<TILE>::kBlock, 0, stream>>>(p);
      break;
    case 4:
      forward_kernel<TILE, 4><<<blocks, TileShape<TILE>::kBlock, 0, stream>>>(p);
      break;
    default:
      return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

}  // namespace

cudaError_t launch_rasterize_forward(const ForwardParams& p, int cdim, cudaStream_t stream) {
  const unsigned blocks = static_cast<unsigned>(p.tiles.tiles_x) * static_cast<unsigned>(p.tiles.tiles_y);
  if (blocks == 0) return cudaSuccess;
  return with_tile_side(p.tiles.tile_size, cudaErrorInvalidValue,
                        [&](auto tile) { return launch<decltype(tile)::value>(p, cdim, blocks, stream); });
}

}  // namespace bytesplat
