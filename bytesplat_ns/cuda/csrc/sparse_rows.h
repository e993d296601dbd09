// Rows of the compacted gradient exchange (grad_compaction.py), packed and unpacked in one launch each.
//
// A gradient row is a splat's values of every parameter side by side: up to kMaxParts gradients [N, width_p],
// D = sum of the widths. The buffer a rank sends is [capacity + 1, slots + D] of float32 (slots = 1) or float16
// (slots = 2): row 0 is the header, an int32 row count (every touched row, sent or not) in the first slots and
// an int32 note in the next; then one row per sent splat, its index as an int32 in the first slots (two
// halves, low first, for float16) and its D values.
//
// pack:   every row with a non-zero value (a pending residual added in) takes a slot from an atomic counter;
//         slots below the capacity go into the buffer (in no particular order), the rest into residual_out,
//         which gets zeros for every other row. No host sync.
// unpack: the gradients zeroed, then every rank's sent rows, times `scale`, added in. A row appears once per
//         buffer, so no two threads add to the same value; ranks are unpacked one launch after another, in rank
//         order, which makes the sums bitwise the same on every rank. The ranks' header rows come back as one
//         small [ranks, 2] tensor (one strided copy, no kernel).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace bytesplat {

constexpr int kMaxParts = 8;

struct RowParts {
  float* ptr[kMaxParts];  // [N, width[p]] each, contiguous
  int width[kMaxParts];
  int parts;
  int64_t rows;  // N
  int values;    // D
};

struct PackParams {
  RowParts grads;             // read
  const float* residual_in;   // [N, D] added to the rows, or nullptr
  float* residual_out;        // [N, D] rows past the capacity (zeros elsewhere), or nullptr; may be residual_in
                              // (each value is read, then written, by the same lane)
  void* buffer;               // [capacity + 1, slots + D]; its header row zeroed before the launch
  bool half;
  int capacity;
  int note;
};

struct UnpackParams {
  RowParts grads;      // += scale * the rows' values
  const void* buffer;  // one rank's [capacity + 1, slots + D]
  bool half;
  int capacity;
  float scale;
};

cudaError_t launch_pack_rows(const PackParams& p, cudaStream_t stream);
cudaError_t launch_unpack_rows(const UnpackParams& p, cudaStream_t stream);

}  // namespace bytesplat

#ifndef __CUDACC__
#include "common.h"

namespace bytesplat {

// -> buffer [capacity + 1, slots + D] (float32, or float16 with `half`).
at::Tensor pack_rows(const std::vector<at::Tensor>& grads,          // each [N, ...] float32
                     const c10::optional<at::Tensor>& residual_in,  // [N, D] float32
                     const c10::optional<at::Tensor>& residual_out,  // [N, D] float32, written
                     int64_t capacity, int64_t note, bool half);

// grads[p] = scale * the sum of every rank's rows in `gathered` [ranks, capacity + 1, slots + D], added in rank
// order. -> the ranks' headers [ranks, 2] int32 (row count, note).
at::Tensor unpack_rows(const std::vector<at::Tensor>& grads, const at::Tensor& gathered, int64_t capacity,
                       double scale);

}  // namespace bytesplat
#endif
