// Pack and unpack kernels of the compacted gradient exchange.
//
// Measured on an H200 (benchmarks/exchange_cost.py, benchmarks/RESULTS.md): the first version, one warp per row
// throughout (read the row, take a slot with an atomic, write it), packed a 2M-splat view's gradients in 0.87 ms,
// where a device copy reads and writes them in 0.23 ms; a tile of rows in shared memory, in rows of D values,
// brought that to 0.37 ms, and ncu then showed both kernels bound by instructions (issued on 86% and 72-77% of
// cycles, 20-25% of the memory bandwidth used). Hence:
// pack:   a block takes a tile of consecutive rows; each part's slice of the tile is one contiguous range, copied
//         as it is into shared memory (16 bytes a load); then a warp per row tells whether it is touched, one
//         thread per row takes a slot (one atomic per warp and owner), and a warp per sent row writes it out.
//         With the render's radii (`visible`), cub's DeviceSelect first lists the rows in view, in row order, and
//         unless most rows are in view the pack's tiles are of listed rows, each copied by a warp (a room seen from
//         inside has a fifth of its rows in view: the other rows are neither read nor walked over). In row order,
//         the tiles cover increasing stretches of rows, as the tiles of consecutive rows do, so the buffer's rows
//         and the unpack's writes keep their locality: listed in no order (one atomic per warp of a listing
//         kernel), the rows packed faster but the unpack lost as much again (benchmarks/RESULTS.md).
//         With `clear` a warp per row read that holds a bit writes it back as zeros, which spares the unpack its
//         pass zeroing all of the gradients.
//         With `send_in_view` (peers reading the rows: every row fits) the listed rows are all sent, each thread
//         moving single values (pack_in_view below), instead of tiles.
// unpack: a warp per kUnpackRows consecutive rows of a buffer, each lane's places in the gradients worked out
//         once, the loads of all of those rows issued together before their adds (the gradient pointers could alias
//         the buffer's, so the compiler would not reorder them itself): a warp waits once for several rows instead
//         of once per row, which counts most where the buffer is a peer's, read over NVLink (peer_rows.py).
//         With two ranks each keeps its own rows in place (the pack's `own_scale`) and unpacks the other's alone:
//         on the room the own rows' unpack took 0.14 ms of a 5.3 ms step (benchmarks/RESULTS.md).
#include <cuda_fp16.h>

#include <algorithm>
#include <cub/device/device_select.cuh>
#include <thrust/iterator/counting_iterator.h>
#include <type_traits>

#include "sparse_rows.h"

namespace bytesplat {
namespace {

constexpr int kThreads = 256;
static_assert(kThreads >= kMaxOwners, "the pack kernel's first block writes every owner's note");
constexpr int kWarps = kThreads / 32;
constexpr int kMaxBlocks = 16384;
constexpr unsigned kAllLanes = 0xffffffffu;
constexpr int kLaneColumns = 2;  // a lane's first columns, whose places stay in registers (rows of up to 64 values)
constexpr int kUnpackRows = 4;   // the rows an unpack warp has in flight at once
constexpr int kMaxUnpackBlocks = 2048;  // about two waves of resident blocks on an H200: its warps stride over
// the rows. Sized by the capacity alone (the count is on the device), a peer's buffer of every row (capacity N)
// would launch thousands of blocks that read its header over NVLink and exit.
constexpr int kUntouched = -1;   // a pack tile row's slot: all of its values are +0.0
constexpr int kSignedZeros = -2;  // untouched, but with a value of -0.0: zeroed all the same with `clear`

// Where column `col` of a row (the parts laid side by side) lies: in part `part`, at `within`, after `before`
// values of the parts before it. Both the gradients and the pack kernel's tile are placed by it.
struct Column {
  int part;
  int before;
  int within;
};

__device__ __forceinline__ Column find_column(const RowParts& g, int col) {
  int before = 0, q = 0;
  for (; q + 1 < g.parts && col >= g.width[q]; ++q) {  // col < D: the last part holds whatever is left
    col -= g.width[q];
    before += g.width[q];
  }
  return {q, before, col};
}

// Value `col` of gradient row `row`.
__device__ __forceinline__ float* value_ptr(const RowParts& g, int64_t row, int col) {
  const Column c = find_column(g, col);
  return g.ptr[c.part] + row * g.stride[c.part] + c.within;
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

// Where value `col` of tile row `r` lies in the pack kernel's tile, which holds each part's rows as they are in
// memory, one part after another: part q's from tile_rows x (the widths of the parts before it) on.
__device__ __forceinline__ int tile_place(const RowParts& g, int tile_rows, int r, int col) {
  const Column c = find_column(g, col);
  return tile_rows * c.before + r * g.width[c.part] + c.within;
}

// A lane's values of a tile row: columns lane, lane + 32, ...; the first kLaneColumns of them have their place in
// the tile and in the gradients worked out once, in registers (start[j] + r * width[j], grad[j] + row * stride[j]).
struct LaneColumns {
  int lane;
  int start[kLaneColumns];  // -1: past D
  int width[kLaneColumns];
  int64_t stride[kLaneColumns];
  float* grad[kLaneColumns];  // the part's value of row 0 at this column

  __device__ LaneColumns(const RowParts& g, int tile_rows) : lane(static_cast<int>(threadIdx.x) & 31) {
#pragma unroll
    for (int j = 0; j < kLaneColumns; ++j) {
      const int col = lane + 32 * j;
      const Column c = find_column(g, col < g.values ? col : 0);
      start[j] = col < g.values ? tile_rows * c.before + c.within : -1;
      width[j] = g.width[c.part];
      stride[j] = g.stride[c.part];
      grad[j] = g.ptr[c.part] + c.within;
    }
  }

  // f(col, place in the tile, the value in the gradients) for each of this lane's values of tile row r, gradient
  // row `row`.
  template <typename F>
  __device__ __forceinline__ void each(const RowParts& g, int tile_rows, int r, int64_t row, F&& f) const {
#pragma unroll
    for (int j = 0; j < kLaneColumns; ++j) {
      if (start[j] >= 0) f(lane + 32 * j, start[j] + r * width[j], grad[j] + row * stride[j]);
    }
    for (int col = lane + 32 * kLaneColumns; col < g.values; col += 32) {
      f(col, tile_place(g, tile_rows, r, col), value_ptr(g, row, col));
    }
  }
};

// `send_in_view`: every listed row sent, zeros included, listed row i in slot i. With no test of a row's values and
// no slot to take, consecutive threads move consecutive values of the listed rows, single values, each thread the
// loads of kInViewValues of them issued before their stores (the buffer could alias the gradients for all the
// compiler knows). A tile row's warp, as the pack kernel has it, waits for one row's loads at a time: on the room
// seen from inside, with a fifth of its 2M rows in view, that kernel took 0.2 ms a step (benchmarks/RESULTS.md).
constexpr int kInViewValues = 4;

template <bool kHalf>
__device__ void pack_in_view(const PackParams& p, const int64_t in_view) {
  using Buf = RowBuffer<kHalf>;
  const int d = p.grads.values;
  if (blockIdx.x == 0 && threadIdx.x == 0) p.headers[0] = static_cast<int>(in_view);
  const int64_t total = in_view * d;
  const bool narrow = total <= INT32_MAX;  // the row of a value by a 32-bit division
  const int64_t threads = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; first < total;
       first += kInViewValues * threads) {
    int64_t slot[kInViewValues], row[kInViewValues];
    int col[kInViewValues];
    float* grad[kInViewValues];
    float value[kInViewValues];
#pragma unroll
    for (int j = 0; j < kInViewValues; ++j) {
      const int64_t i = first + j * threads;
      slot[j] = narrow ? static_cast<int64_t>(static_cast<uint32_t>(i) / static_cast<uint32_t>(d)) : i / d;
      col[j] = static_cast<int>(i - slot[j] * d);
      row[j] = i < total ? p.listed[slot[j]] : 0;
      grad[j] = i < total ? value_ptr(p.grads, row[j], col[j]) : nullptr;
    }
#pragma unroll
    for (int j = 0; j < kInViewValues; ++j) value[j] = grad[j] != nullptr ? *grad[j] : 0.f;
#pragma unroll
    for (int j = 0; j < kInViewValues; ++j) {
      if (grad[j] == nullptr) continue;
      typename Buf::Value* out = Buf::row(p.buffer, 1 + slot[j], d);
      if (col[j] == 0) Buf::put_index(out, static_cast<int32_t>(row[j] * p.index_scale + p.index_offset));
      const typename Buf::Value sent = Buf::encode(value[j]);
      out[Buf::kSlots + col[j]] = sent;
      // as the tile rows' path writes a row sent: zeros, or its value as the others decode it, -0.0 made +0.0
      if (p.clear) *grad[j] = p.own_scale != 0.f ? __fadd_rn(__fmul_rn(p.own_scale, Buf::decode(sent)), 0.f) : 0.f;
    }
  }
}

template <bool kHalf>
__global__ void __launch_bounds__(kThreads) pack_kernel(const PackParams p, const int tile_rows) {
  using Buf = RowBuffer<kHalf>;
  extern __shared__ float4 tile_quads[];  // the tile: tile_rows rows of each part, part after part
  float* tile = reinterpret_cast<float*>(tile_quads);
  __shared__ int slot_of[kThreads];  // each tile row's slot in its owner's buffer, or kUntouched, kSignedZeros
  __shared__ int32_t row_at[kThreads];  // with listed rows: each tile row's row
  const int d = p.grads.values, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const LaneColumns columns(p.grads, tile_rows);
  if (blockIdx.x == 0 && static_cast<int>(threadIdx.x) < p.owners) p.headers[threadIdx.x * kHeaderInts + 1] = p.note;
  const bool held = p.residual != nullptr && *p.residual_rows > 0;  // set after this launch, by the host's copy
  // Tiles of the rows in view, unless most rows are (then tiles of consecutive rows, read whole: the rows out of
  // view hold zeros) or rows are held (those may lie outside the view).
  const int64_t in_view = p.listed != nullptr ? p.headers[p.owners * kHeaderInts + 1] : p.grads.rows;
  const bool listed = p.listed != nullptr && !held && 2 * in_view < p.grads.rows;
  if (listed && p.send_in_view) {
    pack_in_view<kHalf>(p, in_view);
    return;
  }
  const int64_t entries = listed ? in_view : p.grads.rows;
  for (int64_t first = static_cast<int64_t>(blockIdx.x) * tile_rows; first < entries;
       first += static_cast<int64_t>(gridDim.x) * tile_rows) {
    const int n = static_cast<int>(min(static_cast<int64_t>(tile_rows), entries - first));
    const auto row_of = [&](int r) -> int64_t { return listed ? static_cast<int64_t>(row_at[r]) : first + r; };
    // 1. The tile's values: part q's n rows are one contiguous range of n x width values, copied as they are
    //    (four at a time where both sides are 16-byte aligned; a part that is a view of each row's leading values
    //    one value at a time); or the listed rows, a warp each.
    if (listed) {
      if (static_cast<int>(threadIdx.x) < n) row_at[threadIdx.x] = p.listed[first + threadIdx.x];
      __syncthreads();
      for (int r = warp; r < n; r += kWarps) {
        columns.each(p.grads, tile_rows, r, row_at[r], [&](int, int at, const float* grad) { tile[at] = *grad; });
      }
    } else {
      for (int q = 0, offset = 0; q < p.grads.parts; offset += p.grads.width[q], ++q) {
        const int w = p.grads.width[q], count = n * w;
        const int64_t stride = p.grads.stride[q];
        const float* src = p.grads.ptr[q] + first * stride;
        float* dst = tile + tile_rows * offset;
        if (stride != w) {
          for (int i = threadIdx.x; i < count; i += kThreads) dst[i] = src[(i / w) * stride + i % w];
          continue;
        }
        int copied = 0;
        if (((reinterpret_cast<uintptr_t>(src) | reinterpret_cast<uintptr_t>(dst)) & 15) == 0) {
          const float4* src4 = reinterpret_cast<const float4*>(src);
          float4* dst4 = reinterpret_cast<float4*>(dst);
          for (int i = threadIdx.x; i < count / 4; i += kThreads) dst4[i] = src4[i];
          copied = count / 4 * 4;
        }
        for (int i = copied + threadIdx.x; i < count; i += kThreads) dst[i] = src[i];
      }
    }
    __syncthreads();
    if (held) {  // the residual's rows added in: a warp per row (rows held: tiles of consecutive rows)
      for (int r = warp; r < n; r += kWarps) {
        const float* res = p.residual + (first + r) * d;
        columns.each(p.grads, tile_rows, r, first + r, [&](int col, int at, const float*) { tile[at] += res[col]; });
      }
      __syncthreads();
    }
    // 2. Touched rows (a value other than +-0) and rows with a bit set: a warp per row read. With rows held in the
    //    residual the tile is not the gradient, so every row counts as one with a bit set.
    for (int r = warp; r < n; r += kWarps) {
      unsigned bits = 0u;
      columns.each(p.grads, tile_rows, r, row_of(r),
                   [&](int, int at, const float*) { bits |= __float_as_uint(tile[at]); });
      const bool touched = __any_sync(kAllLanes, (bits & 0x7fffffffu) != 0u);
      const bool signed_zeros = held || __any_sync(kAllLanes, bits != 0u);
      if (lane == 0) slot_of[r] = touched ? 0 : (signed_zeros ? kSignedZeros : kUntouched);
    }
    __syncthreads();
    // 3. Slots: thread t for row t, one atomic per warp and owner.
    if (warp * 32 < n) {
      const int t = threadIdx.x;
      const bool touched = t < n && slot_of[t] == 0;
      const unsigned active = __ballot_sync(kAllLanes, touched);
      if (touched) {
        const int owner = p.owners == 1 ? 0 : static_cast<int>(row_of(t) % p.owners);
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
    // 4. The rows sent into their buffers, the rows past the capacity into the residual, and with `clear` the rows
    //    read that hold a bit zeroed in the gradients: a warp per row.
    for (int r = warp; r < n; r += kWarps) {
      const int slot = slot_of[r];
      const int64_t row = row_of(r);
      if (slot >= 0 && slot < p.capacity) {
        const int64_t owner = p.owners == 1 ? 0 : row % p.owners;
        typename Buf::Value* out = Buf::row(p.buffer, owner * (p.capacity + 1) + 1 + slot, d);
        if (lane == 0) Buf::put_index(out, static_cast<int32_t>(row * p.index_scale + p.index_offset));
        columns.each(p.grads, tile_rows, r, row,
                     [&](int col, int at, const float*) { out[Buf::kSlots + col] = Buf::encode(tile[at]); });
      }
      const bool kept = slot >= p.capacity && p.residual != nullptr;  // the host checks that a residual is given
      if (kept || held) {  // nothing held and none kept: the residual's row is all zeros still
        float* res = p.residual + row * d;
        columns.each(p.grads, tile_rows, r, row,
                     [&](int col, int at, const float*) { res[col] = kept ? tile[at] : 0.f; });
      }
      // Zeros, or (own_scale) a sent row as the others will decode it, -0.0 made +0.0: the other rank adds this
      // value to a +0.0 where it did not send the row, so both hold +0.0 there.
      if (p.clear && slot != kUntouched) {
        const bool stays = p.own_scale != 0.f && slot >= 0 && slot < p.capacity;
        columns.each(p.grads, tile_rows, r, row, [&](int, int at, float* grad) {
          *grad = stays ? __fadd_rn(__fmul_rn(p.own_scale, Buf::decode(Buf::encode(tile[at]))), 0.f) : 0.f;
        });
      }
    }
    __syncthreads();  // before the next tile overwrites this one
  }
}

// Where a lane's first kLaneColumns values of any gradient row are (columns lane, lane + 32, ...): worked out
// once, in registers, instead of walking the parts for every value.
struct LaneValues {
  float* ptr[kLaneColumns];      // the part's values of row 0 at this column; nullptr past D
  int64_t stride[kLaneColumns];  // the part's row stride: row r's value is at ptr + r * stride

  __device__ explicit LaneValues(const RowParts& g) {
    const int lane = static_cast<int>(threadIdx.x) & 31;
#pragma unroll
    for (int j = 0; j < kLaneColumns; ++j) {
      const int col = lane + 32 * j;
      const Column c = find_column(g, col < g.values ? col : 0);
      ptr[j] = col < g.values ? g.ptr[c.part] + c.within : nullptr;
      stride[j] = g.stride[c.part];
    }
  }
};

template <bool kHalf>
__global__ void __launch_bounds__(kThreads) unpack_kernel(const UnpackParams p) {
  using Buf = RowBuffer<kHalf>;
  const int d = p.grads.values, lane = threadIdx.x & 31;
  const LaneValues values(p.grads);
  // The header's count, read like a row index: a float16 rank's buffer in a gathered tensor may start on a
  // 2-byte boundary.
  const int count = min(Buf::get_index(Buf::row(p.buffer, 0, d)), p.capacity);
  const int64_t warps = static_cast<int64_t>(gridDim.x) * kWarps;
  for (int64_t first = (static_cast<int64_t>(blockIdx.x) * kWarps + (threadIdx.x >> 5)) * kUnpackRows; first < count;
       first += warps * kUnpackRows) {
    // Every load before the first store; the first rank's rows go into zeros: 0 + x is x, bit for bit.
    int64_t row[kUnpackRows];
    float add[kUnpackRows][kLaneColumns], had[kUnpackRows][kLaneColumns];
#pragma unroll
    for (int k = 0; k < kUnpackRows; ++k) {
      const bool live = first + k < count;
      const typename Buf::Value* in = Buf::row(p.buffer, 1 + (live ? first + k : 0), d);
      const int64_t index = live ? Buf::get_index(in) : -1;
      const int64_t at = index / p.index_divisor;
      row[k] = index >= 0 && at < p.grads.rows ? at : -1;  // a corrupt buffer must not write out of bounds
#pragma unroll
      for (int j = 0; j < kLaneColumns; ++j) {
        add[k][j] = live && values.ptr[j] != nullptr
                        ? __fmul_rn(p.scale, Buf::decode(in[Buf::kSlots + lane + 32 * j])) : 0.f;
      }
    }
#pragma unroll
    for (int k = 0; k < kUnpackRows; ++k) {
#pragma unroll
      for (int j = 0; j < kLaneColumns; ++j) {
        const bool read = row[k] >= 0 && values.ptr[j] != nullptr && !p.first;
        had[k][j] = read ? values.ptr[j][row[k] * values.stride[j]] : 0.f;
      }
    }
#pragma unroll
    for (int k = 0; k < kUnpackRows; ++k) {
      if (row[k] < 0) continue;
#pragma unroll
      for (int j = 0; j < kLaneColumns; ++j) {
        if (values.ptr[j] != nullptr) values.ptr[j][row[k] * values.stride[j]] = __fadd_rn(had[k][j], add[k][j]);
      }
      const typename Buf::Value* in = Buf::row(p.buffer, 1 + first + k, d);
      for (int col = lane + 32 * kLaneColumns; col < d; col += 32) {  // rows wider than the registers hold
        float* at = value_ptr(p.grads, row[k], col);
        *at = __fadd_rn(p.first ? 0.f : *at, __fmul_rn(p.scale, Buf::decode(in[Buf::kSlots + col])));
      }
    }
  }
}

unsigned blocks_for(int64_t items, int64_t per_block) {
  const int64_t blocks = (items + per_block - 1) / per_block;
  return static_cast<unsigned>(blocks < 1 ? 1 : (blocks > kMaxBlocks ? kMaxBlocks : blocks));
}

// Rows of D values in one pack tile: what fits in kPackTileBytes (at least one: the host checks that D is between
// 2 and kPackTileBytes / 4), at most one per thread, whole warps where more than one warp's worth fits.
int pack_tile_rows(int values) {
  const int rows = kPackTileBytes / (static_cast<int>(sizeof(float)) * values);
  return rows >= kThreads ? kThreads : (rows >= 32 ? rows / 32 * 32 : rows);
}

}  // namespace

size_t list_rows_temp_bytes(int64_t rows) {
  size_t bytes = 0;
  cub::DeviceSelect::Flagged(nullptr, bytes, thrust::counting_iterator<int32_t>(0),
                             static_cast<const int32_t*>(nullptr), static_cast<int32_t*>(nullptr),
                             static_cast<int*>(nullptr), static_cast<int>(rows));
  return bytes;
}

cudaError_t launch_pack_rows(const PackParams& p, cudaStream_t stream) {
  if (p.visible != nullptr) {  // the rows in view, in row order; their count after the headers and the held count
    size_t bytes = p.list_temp_bytes;
    const cudaError_t listed = cub::DeviceSelect::Flagged(
        p.list_temp, bytes, thrust::counting_iterator<int32_t>(0), p.visible, p.listed,
        p.headers + p.owners * kHeaderInts + 1, static_cast<int>(p.grads.rows), stream);
    if (listed != cudaSuccess) return listed;
  }
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
  const unsigned blocks = std::min<unsigned>(blocks_for(p.capacity, kWarps * kUnpackRows), kMaxUnpackBlocks);
  if (p.half) {
    unpack_kernel<true><<<blocks, kThreads, 0, stream>>>(p);
  } else {
    unpack_kernel<false><<<blocks, kThreads, 0, stream>>>(p);
  }
  return cudaGetLastError();
}

}  // namespace bytesplat
