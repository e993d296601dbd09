// Fused forward + backward kernel. One block of TILE x TILE threads per tile, one pixel per thread; instantiated for
// 16- and 8-pixel tiles (raster_types.h): kBlock threads in kWarps warps, 256 in 8 or 64 in 2.
//
//  1. Forward: the tile's depth-ordered splats are loaded into shared memory (one chunk of up to `capacity`
//     splats; longer lists, possible only with pruning off, go in several chunks), 2 kBlock at a time, and
//     composited front to back with gsplat's cut-offs; loading stops once every pixel of the tile is saturated.
//     Each thread keeps T_final, its last contributing index and its colour in registers. A warp walks the cached
//     splats a word of 32 at a time: a ballot first keeps the splats that can reach alpha >= 1/255 on its rows
//     (each lane tests one, composite_word), the lanes composite only those, each setting a bit per splat it
//     used, and one OR-reduction per word leaves in shared memory which splats contributed to any of its pixels.
//     Resuming (p.resume: the forward kernel composited the tile already, for a D-SSIM or autograd gradient), it
//     reads T_final, the last index and the colour the forward kept instead, and composites nothing.
//  2. Pixel gradient: from v_render / v_alpha (autograd) or, in loss mode, from the ground truth on-chip:
//     w_l1 * sign(pred - gt) + w_l2 * 2 (pred - gt), over H*W*3, plus v_extra (the D-SSIM gradient).
//  3. Backward: back to front over the same cached splats (the last chunk stays resident; resuming, loaded now up
//     to the last splat any pixel used, with the warps' contribution bits the forward kernel kept), recovering each
//     transmittance as T / (1 - alpha), a word of 32 splats at a time. A warp visits only the splats its bits say
//     its pixels used (jumping from set bit to set bit; a reloaded chunk is walked in full) and the block skips
//     words no warp used. Per-splat gradients are summed over a warp with shuffles (a reduce-scatter: 13 shuffles
//     for all quantities, each lane pair ends with one sum) and added into the splat's slot in shared memory
//     (atomically: warps work independently), kBlock splats per batch. After each batch the block adds each
//     splat's slots to device memory, one atomicAdd per splat and quantity: at most one global update per splat
//     per tile, and two barriers per kBlock splats, so a warp with few splats to visit runs ahead into the next
//     word instead of waiting for the others after each one.
#include "raster_device.cuh"
#include "rasterize_fused.h"

namespace bytesplat {
namespace {

constexpr int kMiscBytes = 64;

// Register budget: the launch bounds ask for kThreadsPerSm threads resident per SM, which caps registers at
// 65536 / 1024 = 64 per thread for either tile side: 4 blocks of 256 threads (16-pixel tiles; ops.BLOCKS_PER_SM
// is the same 4) or 16 blocks of 64 (8-pixel tiles). An 8-pixel block takes the same shared-memory share as a
// 16-pixel one (1 / ops.BLOCKS_PER_SM of the SM), so 4 of them fit an SM.
constexpr int kThreadsPerSm = 1024;
template <int TILE>
constexpr int kMinBlocksPerSm = kThreadsPerSm / TileShape<TILE>::kBlock;
static_assert(kMinBlocksPerSm<kTileLarge> == 4 && kMinBlocksPerSm<kTileSmall> == 16, "see kThreadsPerSm");

// Gradient slots per splat: means2d (2), |means2d| (2), conic (3), colour (CDIM), opacity (1).
template <int CDIM>
struct Slots {
  static constexpr int kMean = 0, kAbs = 2, kConic = 4, kColor = 7, kOpacity = 7 + CDIM, kCount = 8 + CDIM;
};

// The fixed part of shared memory: the backward's batch sums [kBlock][kQ] floats (one batch of kBlock cached splats),
// then warp_last and warp_loss [kWarps] each.
template <int TILE, int CDIM>
__host__ __device__ constexpr int fixed_bytes() {
  constexpr int kWarps = TileShape<TILE>::kWarps;
  static_assert(2 * kWarps * 4 <= kMiscBytes, "warp_last and warp_loss must fit kMiscBytes");
  return (TileShape<TILE>::kBlock * Slots<CDIM>::kCount * 4 + kMiscBytes + 15) / 16 * 16;
}

// Per-warp contribution bits of a chunk of `capacity` splats: [kWarps][words_per_warp].
__host__ __device__ constexpr int mask_words(int capacity) { return (capacity + 31) / 32; }

// Shared memory layout: the fixed part, the splat cache, then the contribution bits.
template <int TILE, int CDIM>
__host__ __device__ constexpr size_t bits_offset(int capacity) {
  return static_cast<size_t>(fixed_bytes<TILE, CDIM>()) +
         static_cast<size_t>(SplatCache<CDIM>::kBytesPerSplat) * capacity;
}

template <int TILE, int CDIM>
__host__ __device__ constexpr size_t smem_bytes(int capacity) {
  return bits_offset<TILE, CDIM>(capacity) + sizeof(uint32_t) * TileShape<TILE>::kWarps * mask_words(capacity);
}

template <int CDIM>
__device__ __forceinline__ void accumulate(const SplatGrads& g, int64_t id, int q, float v) {
  using S = Slots<CDIM>;
  if (q < S::kAbs) {
    atomicAdd(g.means2d + 2 * id + q, v);
  } else if (q < S::kConic) {
    if (g.means2d_abs != nullptr) atomicAdd(g.means2d_abs + 2 * id + (q - S::kAbs), v);
  } else if (q < S::kColor) {
    atomicAdd(g.conics + 3 * id + (q - S::kConic), v);
  } else if (q < S::kOpacity) {
    atomicAdd(g.colors + CDIM * id + (q - S::kColor), v);
  } else {
    atomicAdd(g.opacities + id, v);
  }
}

// Resuming: the forward kernel's contribution bits of cached slots [0, n), list entries off .. off + n - 1, into
// bits [kWarps][words] as the forward part would have left them. Warp w's words past its last used entry
// (warp_last[w]) may never have been written: they read as zero; so do slots past n.
template <int kWarps>
__device__ void load_bits(const FusedParams& p, int first, int tile, int off, int n, const int* warp_last,
                          uint32_t* bits, int words) {
  const int n_words = (n + 31) / 32;
  for (int i = static_cast<int>(threadIdx.x); i < kWarps * n_words; i += static_cast<int>(blockDim.x)) {
    const int w = i / n_words, wi = i - w * n_words;
    const auto kept = [&](int word) {  // the forward's word `word` of this tile's list for warp w
      return 32 * word <= warp_last[w] ? p.resume.bits[pass_bits_index(first, tile, word, w, kWarps)] : 0u;
    };
    const int e = off + 32 * wi;  // the list entry of this word's bit 0
    const int shift = e & 31;
    uint32_t v = kept(e >> 5) >> shift;
    if (shift != 0) v |= kept((e >> 5) + 1) << (32 - shift);
    const int rest = n - 32 * wi;
    if (rest < 32) v &= (1u << rest) - 1u;
    bits[w * words + wi] = v;
  }
}

// Loss mode: dL/d render (vC) and dL/d alpha (vA) of one pixel, and its share of the loss.
__device__ __forceinline__ float pixel_loss_grad(const PixelGradSource& s, int index, float T, const float (&C)[3],
                                                 float (&vC)[3], float& vA) {
  float loss = 0.f;
  vA = 0.f;
#pragma unroll
  for (int d = 0; d < 3; ++d) {
    const float bg = s.background != nullptr ? s.background[d] : 0.f;
    const float pred = C[d] + T * bg;  // render + (1 - alpha) * background
    const float out = s.clamp ? fminf(fmaxf(pred, 0.f), 1.f) : pred;
    const float diff = out - s.gt[3 * index + d];
    loss += s.w_l1 * fabsf(diff) + s.w_l2 * diff * diff;
    const float sgn = diff > 0.f ? 1.f : (diff < 0.f ? -1.f : 0.f);
    float g = (s.w_l1 * sgn + 2.f * s.w_l2 * diff) * s.inv_count;
    if (s.v_extra != nullptr) g += s.v_extra[3 * index + d];
    if (s.clamp && (pred < 0.f || pred > 1.f)) g = 0.f;  // torch.clamp passes the gradient on [0, 1]
    vC[d] = g;
    vA -= g * bg;
  }
  return loss * s.inv_count;
}

template <int TILE, int CDIM, bool kLoss>
__global__ void __launch_bounds__(TileShape<TILE>::kBlock, kMinBlocksPerSm<TILE>) fused_kernel(const FusedParams p) {
  static_assert(!kLoss || CDIM == 3, "the in-kernel loss is defined on RGB");
  constexpr int kBlock = TileShape<TILE>::kBlock;
  constexpr int kWarps = TileShape<TILE>::kWarps;
  using S = Slots<CDIM>;
  constexpr int kQ = S::kCount;
  // Splats the forward loads between two checks of whether the whole tile is saturated: two per thread, so a tile
  // that composites up to 2 kBlock splats waits at one barrier pair instead of two.
  constexpr int kLoad = 2 * kBlock;
  extern __shared__ __align__(16) unsigned char smem[];
  float* sums = reinterpret_cast<float*>(smem);  // [kBlock][kQ]: the backward's sums of one batch of splats
  int* warp_last = reinterpret_cast<int*>(sums + kBlock * kQ);     // [kWarps]
  float* warp_loss = reinterpret_cast<float*>(warp_last + kWarps);  // [kWarps]
  const SplatCache<CDIM> cache = SplatCache<CDIM>::carve(smem + fixed_bytes<TILE, CDIM>(), p.capacity);

  const int tile = static_cast<int>(blockIdx.x);
  const int lane = static_cast<int>(threadIdx.x) & 31;
  const int warp = static_cast<int>(threadIdx.x) >> 5;
  const int words = mask_words(p.capacity);
  uint32_t* all_bits = reinterpret_cast<uint32_t*>(smem + bits_offset<TILE, CDIM>(p.capacity));  // [kWarps][words]
  uint32_t* used_bits = all_bits + warp * words;  // this warp's contribution bits
  const PixelCoord<TILE> pix(tile, p.tiles.tiles_x, p.width, p.height);
  const float px = static_cast<float>(pix.x) + 0.5f;
  const float py = static_cast<float>(pix.y) + 0.5f;
  const WarpRect<TILE> rect(tile, p.tiles.tiles_x);
  const int first = p.tiles.start[tile];
  const int count = p.tiles.end[tile] - first;
  const int cap = p.capacity;
  const int n_chunks = (count + cap - 1) / cap;
  // The backward's batch sums start at zero (the barriers before the backward order this); each flush clears them.
  for (int i = static_cast<int>(threadIdx.x); i < kBlock * kQ; i += kBlock) sums[i] = 0.f;

  // 1. Forward, front to back.
  float T = 1.f;
  float C[CDIM];
#pragma unroll
  for (int d = 0; d < CDIM; ++d) C[d] = 0.f;
  int last = -1;  // index in the tile's list of the last splat composited into this pixel
  bool done = !pix.inside;
  int resident = -1;  // chunk now (partly) in shared memory (block-uniform)
  const bool resume = p.resume.transmittance != nullptr;  // block-uniform
  if (resume && pix.inside) {
    T = p.resume.transmittance[pix.index];
    last = p.resume.last[pix.index];
    if constexpr (kLoss) {  // the loss reads the prediction; autograd's gradient comes in whole
#pragma unroll
      for (int d = 0; d < CDIM; ++d) C[d] = p.resume.render[static_cast<int64_t>(CDIM) * pix.index + d];
    }
  }
  bool block_done = resume;
  for (int k = 0; k < n_chunks && !block_done; ++k) {
    const int off = k * cap;
    const int len = min(cap, count - off);
    // Loaded in batches of kLoad, each composited before the next is read, so a tile whose pixels all saturate
    // early reads no more of its list (the backward needs no entry past the last one used).
    for (int b = 0; b < len; b += kLoad) {
      if (__syncthreads_count(done) == kBlock) {  // also the barrier before the cache is overwritten
        block_done = true;
        break;
      }
      if (b == 0) {  // this chunk's bits start clear: words the warp never walks stay 0 (the barrier below orders it)
        for (int i = lane; i < words; i += 32) used_bits[i] = 0u;
      }
      const int nb = min(kLoad, len - b);
      cache.load(p.splats, p.tiles.ids, first + off + b, nb, b);
      resident = k;
      __syncthreads();
      // A word of 32 splats at a time, until the warp's pixels are all saturated; the word's bits: the splats any
      // pixel of the warp composited.
      for (int w0 = b; w0 < b + nb; w0 += 32) {
        if (__all_sync(kFullMask, done)) break;
        const uint32_t mine = composite_word<TILE, CDIM>(cache, w0, min(32, b + nb - w0), rect, px, py, T, C, done);
        if (mine != 0u) last = off + w0 + 31 - __clz(mine);
        const uint32_t word = __reduce_or_sync(kFullMask, mine);
        if (lane == 0) used_bits[w0 >> 5] = word;
      }
    }
  }
  if (pix.inside && p.render != nullptr) {
#pragma unroll
    for (int d = 0; d < CDIM; ++d) p.render[static_cast<int64_t>(CDIM) * pix.index + d] = C[d];
  }
  if (pix.inside && p.alpha != nullptr) p.alpha[pix.index] = 1.f - T;

  // 2. This pixel's gradient with respect to its colour (vC) and alpha (vA).
  float vC[CDIM];
  float vA = 0.f;
  float loss = 0.f;
  if constexpr (kLoss) {
    if (pix.inside) {
      loss = pixel_loss_grad(p.src, pix.index, T, C, vC, vA);
    } else {
#pragma unroll
      for (int d = 0; d < CDIM; ++d) vC[d] = 0.f;
    }
  } else {
#pragma unroll
    for (int d = 0; d < CDIM; ++d) {
      vC[d] = pix.inside ? p.src.v_render[static_cast<int64_t>(CDIM) * pix.index + d] : 0.f;
    }
    vA = (pix.inside && p.src.v_alpha != nullptr) ? p.src.v_alpha[pix.index] : 0.f;
  }

  const int wlast = warp_max(last);
  const float wloss = warp_sum(loss);
  if (lane == 0) {
    warp_last[warp] = wlast;
    warp_loss[warp] = wloss;
  }
  __syncthreads();
  int block_last = -1;
  float block_loss = 0.f;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) {
    block_last = max(block_last, warp_last[w]);
    block_loss += warp_loss[w];
  }
  if constexpr (kLoss) {
    if (threadIdx.x == 0) atomicAdd(p.src.loss, block_loss);
  }
  if (block_last < 0) return;  // block-uniform: no pixel of the tile used a splat

  // 3. Backward, back to front, in batches of kBlock cached splats, each a word of 32 splats at a time.
  const int q_lane = scattered_index<kQ>(lane);  // the quantity whose warp sum this lane gets (-1: none)
  const float T_final = T;
  float acc[CDIM];  // sum of weight * colour over the splats behind the current one
#pragma unroll
  for (int d = 0; d < CDIM; ++d) acc[d] = 0.f;
  bool bits_valid = true;
  for (int k = block_last / cap; k >= 0; --k) {
    const int off = k * cap;
    const int len = min(cap, count - off);
    if (k != resident) {
      __syncthreads();
      const int n = min(len, block_last - off + 1);  // no slot past the last splat any pixel used is read
      cache.load(p.splats, p.tiles.ids, first + off, n);
      if (resume) load_bits<kWarps>(p, first, tile, off, n, warp_last, all_bits, words);
      resident = k;
      bits_valid = resume;  // without the kept bits, the forward's were for another chunk: walk every splat
      __syncthreads();
    }
    const int top = min(block_last - off, len - 1);  // the last cached splat any pixel used
    for (int batch = top / kBlock * kBlock; batch >= 0; batch -= kBlock) {
      bool visited = false;  // block-uniform: whether a warp visited a splat of this batch
      for (int wi = min(top, batch + kBlock - 1) >> 5; wi >= batch >> 5; --wi) {
        const int base = wi << 5;
        // The splats this warp visits: those its pixels used (the block skips a word no warp used, block-uniform),
        // or in a reloaded chunk every one up to top.
        uint32_t todo;
        if (bits_valid) {
          uint32_t any = 0u;
#pragma unroll
          for (int w = 0; w < kWarps; ++w) any |= all_bits[w * words + wi];
          if (any == 0u) continue;
          todo = used_bits[wi];  // warp-uniform
        } else {
          const int span = min(31, top - base);  // this word holds splats base .. base + span
          todo = span == 31 ? kFullMask : (2u << span) - 1u;
        }
        visited = true;
        while (todo != 0u) {
          const int t = 31 - __clz(todo);  // back to front
          todo ^= 1u << t;
          const int j = base + t;
          // Inactive lanes keep fac = v_sigma = v_opacity = 0, which zeroes all their quantities below.
          float dx, dy, tq, vis, alpha, fac = 0.f, v_sigma = 0.f, v_opacity = 0.f;
          const float4 geo = cache.geo[j];
          const float4 geo2 = cache.geo2[j];
          const bool counts = splat_alpha(geo, geo2, px, py, dx, dy, tq, vis, alpha);
          const bool active = counts && off + j <= last;
          if (active) {
            const float ra = fast_rcp(1.f - alpha);
            T *= ra;  // transmittance in front of splat j
            fac = alpha * T;
            float v_alpha = T_final * ra * vA;
            float col[CDIM];
            cache.colour(j, geo2, col);
#pragma unroll
            for (int d = 0; d < CDIM; ++d) {
              v_alpha += (col[d] * T - acc[d] * ra) * vC[d];
              acc[d] += fac * col[d];
            }
            const float raw = geo2.y * vis;
            if (raw <= kAlphaMax) {  // min(kAlphaMax, raw) passes the gradient only below the clamp
              v_sigma = -raw * v_alpha;
              v_opacity = vis * v_alpha;
            }
          }
          if (!__any_sync(kFullMask, active)) continue;
          float g[kQ];
#pragma unroll
          for (int d = 0; d < CDIM; ++d) g[S::kColor + d] = fac * vC[d];
          g[S::kConic] = 0.5f * v_sigma * dx * dx;
          g[S::kConic + 1] = v_sigma * dx * dy;
          g[S::kConic + 2] = 0.5f * v_sigma * dy * dy;
          // d sigma / d mean = (a dx + b dy, b dx + c dy) = -ln2 (2 qa dx + qb dy, qb dx + 2 qc dy)
          const float w = -kLn2 * v_sigma;
          g[S::kMean] = w * fmaf(geo.z, dx, tq);
          g[S::kMean + 1] = w * fmaf(2.f * geo2.x, dy, geo.w * dx);
          g[S::kAbs] = fabsf(g[S::kMean]);
          g[S::kAbs + 1] = fabsf(g[S::kMean + 1]);
          g[S::kOpacity] = v_opacity;
          // The warp's sum of each quantity, one quantity per lane pair, added into the splat's batch slot.
          const float sum = warp_sum_scattered<kQ>(g, lane);
          if ((lane & 1) == 0 && q_lane >= 0) atomicAdd(&sums[(j - batch) * kQ + q_lane], sum);
        }
      }
      if (!visited) continue;
      __syncthreads();
      // Each splat's sum over the warps that visited it, one atomicAdd per splat and quantity; the slots are
      // cleared for the next batch. Thread s takes the batch's splat s.
      const int s = static_cast<int>(threadIdx.x);
      if (batch + s <= top) {
        float* slot = sums + s * kQ;
        int64_t id = -1;
#pragma unroll
        for (int q = 0; q < kQ; ++q) {
          const float v = slot[q];
          if (v == 0.f) continue;
          slot[q] = 0.f;
          if (id < 0) id = p.tiles.ids[first + off + batch + s];
          accumulate<CDIM>(p.grads, id, q, v);
        }
      }
      __syncthreads();  // before the next batch adds into the slots
    }
  }
}

template <int TILE, int CDIM, bool kLoss>
cudaError_t launch(const FusedParams& p, cudaStream_t stream) {
  const size_t bytes = smem_bytes<TILE, CDIM>(p.capacity);
  cudaError_t err = cudaFuncSetAttribute(fused_kernel<TILE, CDIM, kLoss>,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes));
  if (err != cudaSuccess) return err;
  const unsigned blocks = static_cast<unsigned>(p.tiles.tiles_x) * static_cast<unsigned>(p.tiles.tiles_y);
  fused_kernel<TILE, CDIM, kLoss><<<blocks, TileShape<TILE>::kBlock, bytes, stream>>>(p);
  return cudaGetLastError();
}

template <int TILE>
cudaError_t launch_tile(const FusedParams& p, int cdim, cudaStream_t stream) {
  const bool loss = p.src.gt != nullptr;
  if (cdim == 3) return loss ? launch<TILE, 3, true>(p, stream) : launch<TILE, 3, false>(p, stream);
  if (cdim == 4 && !loss) return launch<TILE, 4, false>(p, stream);
  return cudaErrorInvalidValue;
}

}  // namespace

size_t fused_smem_bytes(int tile_size, int cdim, int capacity) {
  return with_tile_side(tile_size, size_t{0}, [&](auto tile) {
    constexpr int kTile = decltype(tile)::value;
    return cdim == 3 ? smem_bytes<kTile, 3>(capacity) : smem_bytes<kTile, 4>(capacity);
  });
}

int fused_tile_capacity(int tile_size, int cdim, int blocks_per_sm, int device) {
  if (tile_size != kTileLarge && tile_size != kTileSmall) return -1;
  int per_block = 0, per_sm = 0, reserved = 0;
  if (cudaDeviceGetAttribute(&per_block, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) != cudaSuccess ||
      cudaDeviceGetAttribute(&per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, device) != cudaSuccess ||
      cudaDeviceGetAttribute(&reserved, cudaDevAttrReservedSharedMemoryPerBlock, device) != cudaSuccess) {
    return -1;
  }
  // The same share of the SM per block for either tile side; an 8-pixel tile's block keeps less in its fixed
  // part (2 warps' partial sums instead of 8), so it holds more splats.
  const int share = per_sm / (blocks_per_sm > 0 ? blocks_per_sm : 1) - reserved;
  const int budget = share < per_block ? share : per_block;
  const size_t fixed = fused_smem_bytes(tile_size, cdim, 0);
  if (budget <= static_cast<int>(fixed)) return 0;
  const int cache_bytes = cdim == 3 ? SplatCache<3>::kBytesPerSplat : SplatCache<4>::kBytesPerSplat;
  int capacity = static_cast<int>((static_cast<size_t>(budget) - fixed) / cache_bytes);  // bits left out: a bound
  while (capacity > 0 && fused_smem_bytes(tile_size, cdim, capacity) > static_cast<size_t>(budget)) --capacity;
  return capacity;
}

cudaError_t launch_rasterize_fused(const FusedParams& p, int cdim, cudaStream_t stream) {
  if (p.tiles.tiles_x * p.tiles.tiles_y == 0) return cudaSuccess;
  if (p.capacity <= 0) return cudaErrorInvalidValue;
  return with_tile_side(p.tiles.tile_size, cudaErrorInvalidValue,
                        [&](auto tile) { return launch_tile<decltype(tile)::value>(p, cdim, stream); });
}

}  // namespace bytesplat
