// Pack and unpack kernels of the compacted gradient exchange: one warp per gradient row, lanes over its values,
// a grid-stride loop over the rows.
#include <cuda_fp16.h>

#include <type_traits>

#include "sparse_rows.h"

namespace bytesplat {
namespace {

constexpr int kThreads = kMaxOwners;
constexpr int kMaxBlocks = 16384;
constexpr unsigned kAllLanes = 0xffffffffu;

// Value `col` of row `row` across the parts laid side by side.
__device__ __forceinline__ float* value_ptr(const RowParts& g, int64_t row, int col) {
  for (int q = 0; q < g.parts; ++q) {
    if (col < g.width[q]) return g.ptr[q] + row * g.width[q] + col;
    col -= g.width[q];
  }
  return nullptr;  // col >= D: never asked for
}

// One warp per row: this warp's first row and the stride of a grid-stride loop over rows; lanes cover values.
struct WarpRows {
  int lane;
  int64_t first;
  int64_t stride;
  __device__ WarpRows()
      : lane(static_cast<int>(threadIdx.x) & 31),
        first((static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) >> 5),
        stride((static_cast<int64_t>(gridDim.x) * blockDim.x) >> 5) {}
};

// The value to pack: the gradient, plus the residual's when it holds rows.
__device__ __forceinline__ float packed_value(const PackParams& p, bool held, int64_t row, int col) {
  const float v = *value_ptr(p.grads, row, col);
  return held ? v + p.residual[row * p.grads.values + col] : v;
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
__global__ void __launch_bounds__(kThreads) pack_kernel(const PackParams p) {
  using Buf = RowBuffer<kHalf>;
  const WarpRows w;
  const int lane = w.lane, d = p.grads.values;
  if (blockIdx.x == 0 && static_cast<int>(threadIdx.x) < p.owners) p.headers[threadIdx.x * kHeaderInts + 1] = p.note;
  const bool held = p.residual != nullptr && *p.residual_rows > 0;  // set after this launch, by the host's copy
  for (int64_t row = w.first; row < p.grads.rows; row += w.stride) {
    bool touched = false;
    for (int col = lane; col < d; col += 32) touched |= packed_value(p, held, row, col) != 0.f;
    touched = __any_sync(kAllLanes, touched);
    const int owner = static_cast<int>(row % p.owners);
    int slot = 0;
    if (touched && lane == 0) slot = atomicAdd(p.headers + owner * kHeaderInts, 1);
    slot = __shfl_sync(kAllLanes, slot, 0);
    const bool sent = touched && slot < p.capacity;
    const bool kept = touched && !sent && p.residual != nullptr;  // the host checks that a residual is given then
    if (kept && lane == 0) atomicAdd(p.headers + p.owners * kHeaderInts, 1);
    const int64_t at = static_cast<int64_t>(owner) * (p.capacity + 1) + 1 + slot;  // of owners x (capacity + 1) rows
    typename Buf::Value* out = sent ? Buf::row(p.buffer, at, d) : nullptr;
    if (sent && lane == 0) Buf::put_index(out, static_cast<int32_t>(row * p.index_scale + p.index_offset));
    for (int col = lane; col < d; col += 32) {
      const float v = packed_value(p, held, row, col);
      if (sent) out[Buf::kSlots + col] = Buf::encode(v);
      if (kept || held) p.residual[row * d + col] = kept ? v : 0.f;  // nothing held and none kept: all zeros still
    }
  }
}

template <bool kHalf>
__global__ void __launch_bounds__(kThreads) unpack_kernel(const UnpackParams p) {
  using Buf = RowBuffer<kHalf>;
  const WarpRows w;
  const int d = p.grads.values;
  // The header's count, read like a row index: a float16 rank's buffer in a gathered tensor may start on a
  // 2-byte boundary.
  const int count = min(Buf::get_index(Buf::row(p.buffer, 0, d)), p.capacity);
  for (int64_t i = w.first; i < count; i += w.stride) {
    const typename Buf::Value* in = Buf::row(p.buffer, 1 + i, d);
    const int64_t index = Buf::get_index(in);
    const int64_t row = index / p.index_divisor;
    if (index < 0 || row >= p.grads.rows) continue;  // a corrupt buffer must not write out of bounds
    for (int col = w.lane; col < d; col += 32) {
      *value_ptr(p.grads, row, col) += p.scale * Buf::decode(in[Buf::kSlots + col]);
    }
  }
}

unsigned blocks_for(int64_t rows) {
  const int64_t warps_per_block = kThreads / 32;
  const int64_t blocks = (rows + warps_per_block - 1) / warps_per_block;
  return static_cast<unsigned>(blocks < 1 ? 1 : (blocks > kMaxBlocks ? kMaxBlocks : blocks));
}

}  // namespace

cudaError_t launch_pack_rows(const PackParams& p, cudaStream_t stream) {
  const unsigned blocks = blocks_for(p.grads.rows);
  if (p.half) {
    pack_kernel<true><<<blocks, kThreads, 0, stream>>>(p);
  } else {
    pack_kernel<false><<<blocks, kThreads, 0, stream>>>(p);
  }
  return cudaGetLastError();
}

cudaError_t launch_unpack_rows(const UnpackParams& p, cudaStream_t stream) {
  const unsigned blocks = blocks_for(p.capacity);
  if (p.half) {
    unpack_kernel<true><<<blocks, kThreads, 0, stream>>>(p);
  } else {
    unpack_kernel<false><<<blocks, kThreads, 0, stream>>>(p);
  }
  return cudaGetLastError();
}

}  // namespace bytesplat
