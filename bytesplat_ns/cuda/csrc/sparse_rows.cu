// Pack and unpack kernels of the compacted gradient exchange.
//
// Both are bound by memory, and by how many loads each warp has in flight: a warp that reads a row, waits for an
// atomic slot and then writes it moves too few bytes at a time (the first version, one warp per row throughout,
// packed a 2M-splat view's gradients in 0.87 ms on an H200, where a device copy reads and writes them in 0.23 ms;
// benchmarks/exchange_cost.py). So:
// pack:   a block takes a tile of consecutive rows; each part's slice of the tile is one contiguous range, read
//         by all threads at once into shared memory; then a warp per row tells whether it is touched, one thread
//         per row takes a slot (one atomic per warp and owner), and a warp per sent row writes it out.
// unpack: a warp per row, its loads issued together before its adds (the gradient pointers could alias the
//         buffer's, so the compiler would not reorder them itself).
#include <cuda_fp16.h>

#include <type_traits>

#include "sparse_rows.h"

namespace bytesplat {
namespace {

constexpr int kThreads = 256;
static_assert(kThreads >= kMaxOwners, "the pack kernel's first block writes every owner's note");
constexpr int kWarps = kThreads / 32;
constexpr int kMaxBlocks = 16384;
constexpr unsigned kAllLanes = 0xffffffffu;
constexpr int kUnpackValuesPerLane = 4;  // a row's loads in flight together: up to 128 values at once

// Value `col` of row `row` across the parts laid side by side.
__device__ __forceinline__ float* value_ptr(const RowParts& g, int64_t row, int col) {
  for (int q = 0; q < g.parts; ++q) {
    if (col < g.width[q]) return g.ptr[q] + row * g.width[q] + col;
    col -= g.width[q];
  }
  return nullptr;  // col >= D: never asked for
}

template <bool kHalf>
struct RowBuffer {
  using Value = typename std::conditional<kHalf, __half, float>::type;
  static constexpr int kSlots = kHalf ? 2 : 1;

  __device__ static Value* row(void* buffer, int64_t r, int values) {
    return static_cast<Value*>(buffer) + r * (kSlots + values);
  }
  __device__ static const Value* row(const void* buffer, int64_t r, int values) {
    return static_cast<const Value*>(buffer) + r * (kSlots + values);
  }
  // The int32 row index (or the header's count) in the first slots (float16 rows may sit on 2-byte boundaries:
  // two 16-bit halves).
  __device__ static void put_index(Value* at, int32_t index) {
    if constexpr (kHalf) {
      auto* halves = reinterpret_cast<uint16_t*>(at);
      halves[0] = static_cast<uint16_t>(static_cast<uint32_t>(index) & 0xffffu);
      halves[1] = static_cast<uint16_t>(static_cast<uint32_t>(index) >> 16);
    } else {
      *reinterpret_cast<int32_t*>(at) = index;
    }
  }
  __device__ static int32_t get_index(const Value* at) {
    if constexpr (kHalf) {
      const auto* halves = reinterpret_cast<const uint16_t*>(at);
      return static_cast<int32_t>(static_cast<uint32_t>(halves[0]) | (static_cast<uint32_t>(halves[1]) << 16));
    } else {
      return *reinterpret_cast<const int32_t*>(at);
    }
  }
  __device__ static Value encode(float v) {
    if constexpr (kHalf) {
      return __float2half_rn(v);
    } else {
      return v;
    }
  }
  __device__ static float decode(Value v) {
    if constexpr (kHalf) {
      return __half2float(v);
    } else {
      return v;
    }
  }
};

template <bool kHalf>
__global__ void __launch_bounds__(kThreads) pack_kernel(const PackParams p, const int tile_rows) {
  using Buf = RowBuffer<kHalf>;
  extern __shared__ float tile[];  // [tile_rows, D]: this block's rows, every part side by side
  __shared__ int slot_of[kThreads];  // each tile row's slot in its owner's buffer; -1: not touched
  const int d = p.grads.values, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (blockIdx.x == 0 && static_cast<int>(threadIdx.x) < p.owners) p.headers[threadIdx.x * kHeaderInts + 1] = p.note;
  const bool held = p.residual != nullptr && *p.residual_rows > 0;  // set after this launch, by the host's copy
  for (int64_t first = static_cast<int64_t>(blockIdx.x) * tile_rows; first < p.grads.rows;
       first += static_cast<int64_t>(gridDim.x) * tile_rows) {
    const int n = static_cast<int>(min(static_cast<int64_t>(tile_rows), p.grads.rows - first));
    // 1. The tile's values: part q's rows are one contiguous range of n * width values.
    for (int q = 0, offset = 0; q < p.grads.parts; offset += p.grads.width[q], ++q) {
      const int w = p.grads.width[q];
      if (w == 0) continue;  // e.g. the SH coefficients past the DC term at degree 0
      const float* src = p.grads.ptr[q] + first * w;
      int r = threadIdx.x / w, c = threadIdx.x % w;  // of value i = threadIdx.x, stepped without dividing
      const int dr = kThreads / w, dc = kThreads % w;
      for (int i = threadIdx.x; i < n * w; i += kThreads) {
        tile[r * d + offset + c] = src[i];
        r += dr;
        c += dc;
        if (c >= w) {
          c -= w;
          ++r;
        }
      }
    }
    __syncthreads();
    if (held) {  // the residual's rows are laid out as the tile's
      const float* res = p.residual + first * d;
      for (int i = threadIdx.x; i < n * d; i += kThreads) tile[i] += res[i];
      __syncthreads();
    }
    // 2. Touched rows: a warp per row.
    for (int r = warp; r < n; r += kWarps) {
      bool touched = false;
      for (int c = lane; c < d; c += 32) touched |= tile[r * d + c] != 0.f;
      touched = __any_sync(kAllLanes, touched);
      if (lane == 0) slot_of[r] = touched ? 0 : -1;
    }
    __syncthreads();
    // 3. Slots: thread t for row t, one atomic per warp and owner.
    if (warp * 32 < n) {
      const int t = threadIdx.x;
      const bool touched = t < n && slot_of[t] == 0;
      const unsigned active = __ballot_sync(kAllLanes, touched);
      if (touched) {
        const int owner = static_cast<int>((first + t) % p.owners);
        const unsigned same = __match_any_sync(active, owner);  // this warp's touched rows of this owner
        const int leader = __ffs(same) - 1;
        int base = 0;
        if (lane == leader) base = atomicAdd(p.headers + owner * kHeaderInts, __popc(same));
        base = __shfl_sync(same, base, leader);
        const int slot = base + __popc(same & ((1u << lane) - 1u));
        slot_of[t] = slot;
        if (slot >= p.capacity && p.residual != nullptr) atomicAdd(p.headers + p.owners * kHeaderInts, 1);
      }
    }
    __syncthreads();
    // 4. The rows sent into their buffers, the rows past the capacity into the residual: a warp per row.
    for (int r = warp; r < n; r += kWarps) {
      const int slot = slot_of[r];
      const int64_t row = first + r;
      if (slot >= 0 && slot < p.capacity) {
        const int64_t at = (row % p.owners) * (p.capacity + 1) + 1 + slot;  // of owners x (capacity + 1) rows
        typename Buf::Value* out = Buf::row(p.buffer, at, d);
        if (lane == 0) Buf::put_index(out, static_cast<int32_t>(row * p.index_scale + p.index_offset));
        for (int c = lane; c < d; c += 32) out[Buf::kSlots + c] = Buf::encode(tile[r * d + c]);
      }
      const bool kept = slot >= p.capacity && p.residual != nullptr;  // the host checks that a residual is given
      if (kept || held) {  // nothing held and none kept: the residual's row is all zeros still
        for (int c = lane; c < d; c += 32) p.residual[row * d + c] = kept ? tile[r * d + c] : 0.f;
      }
    }
    __syncthreads();  // before the next tile overwrites this one
  }
}

template <bool kHalf>
__global__ void __launch_bounds__(kThreads) unpack_kernel(const UnpackParams p) {
  using Buf = RowBuffer<kHalf>;
  const int d = p.grads.values, lane = threadIdx.x & 31;
  // The header's count, read like a row index: a float16 rank's buffer in a gathered tensor may start on a
  // 2-byte boundary.
  const int count = min(Buf::get_index(Buf::row(p.buffer, 0, d)), p.capacity);
  const int64_t warps = static_cast<int64_t>(gridDim.x) * kWarps;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kWarps + (threadIdx.x >> 5); i < count; i += warps) {
    const typename Buf::Value* in = Buf::row(p.buffer, 1 + i, d);
    const int64_t index = Buf::get_index(in);
    const int64_t row = index / p.index_divisor;
    if (index < 0 || row >= p.grads.rows) continue;  // a corrupt buffer must not write out of bounds
    for (int c0 = 0; c0 < d; c0 += 32 * kUnpackValuesPerLane) {
      float add[kUnpackValuesPerLane], had[kUnpackValuesPerLane];
      float* at[kUnpackValuesPerLane];
#pragma unroll
      for (int k = 0; k < kUnpackValuesPerLane; ++k) {
        const int c = c0 + k * 32 + lane;
        at[k] = c < d ? value_ptr(p.grads, row, c) : nullptr;
        add[k] = c < d ? p.scale * Buf::decode(in[Buf::kSlots + c]) : 0.f;
      }
#pragma unroll
      for (int k = 0; k < kUnpackValuesPerLane; ++k) had[k] = at[k] != nullptr && !p.first ? *at[k] : 0.f;
#pragma unroll
      for (int k = 0; k < kUnpackValuesPerLane; ++k) {
        if (at[k] != nullptr) *at[k] = had[k] + add[k];  // the first rank's into zeros: 0 + x is x, bit for bit
      }
    }
  }
}

unsigned blocks_for(int64_t items, int64_t per_block) {
  const int64_t blocks = (items + per_block - 1) / per_block;
  return static_cast<unsigned>(blocks < 1 ? 1 : (blocks > kMaxBlocks ? kMaxBlocks : blocks));
}

// Rows of D values in one pack tile: what fits in kPackTileBytes (at least one: the host checks that one does),
// at most one per thread, whole warps where more than one warp's worth fits.
int pack_tile_rows(int values) {
  const int rows = kPackTileBytes / (static_cast<int>(sizeof(float)) * (values > 0 ? values : 1));
  return rows >= kThreads ? kThreads : (rows >= 32 ? rows / 32 * 32 : (rows > 0 ? rows : 1));
}

}  // namespace

cudaError_t launch_pack_rows(const PackParams& p, cudaStream_t stream) {
  const int tile_rows = pack_tile_rows(p.grads.values);
  const unsigned blocks = blocks_for(p.grads.rows, tile_rows);
  const size_t shared = sizeof(float) * tile_rows * p.grads.values;
  if (p.half) {
    pack_kernel<true><<<blocks, kThreads, shared, stream>>>(p, tile_rows);
  } else {
    pack_kernel<false><<<blocks, kThreads, shared, stream>>>(p, tile_rows);
  }
  return cudaGetLastError();
}

cudaError_t launch_unpack_rows(const UnpackParams& p, cudaStream_t stream) {
  const unsigned blocks = blocks_for(p.capacity, kWarps);
  if (p.half) {
    unpack_kernel<true><<<blocks, kThreads, 0, stream>>>(p);
  } else {
    unpack_kernel<false><<<blocks, kThreads, 0, stream>>>(p);
  }
  return cudaGetLastError();
}

}  // namespace bytesplat
