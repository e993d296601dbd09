// Rows of the compacted gradient exchange (grad_compaction.py), packed in one launch, unpacked in one per rank.
//
// A gradient row is a splat's values of every parameter side by side: up to kMaxParts gradients [N, width_p],
// D = sum of the widths; a part may be a view of each row's leading values (a row stride above its width: the SH
// coefficients up to the degree in use, the rest holding zeros that need not travel). A buffer is
// [capacity + 1, slots + D] of float32 (slots = 1) or float16 (slots = 2): row 0 is the header, kHeaderInts
// int32s (the row count: every touched row, sent or not, or every row in view with `send_in_view`; a note; a third
// value the caller may set, zero here), each in `slots` slots; then one row per sent splat, its index as an int32 in
// the first slots (two halves, low first, for float16) and its D values.
//
// pack:   the rows split among `owners` buffers [owners, capacity + 1, slots + D], row i going to buffer
//         i mod owners (owners = 1: one buffer for an all-gather; owners = W: one per rank for an all-to-all),
//         its index written as i * index_scale + index_offset (an owner's slice of the rows, row j standing for
//         row j * W + rank of the whole).
//         Every row with a non-zero value (the rows held in `residual` added in) takes a slot of its buffer from
//         an atomic counter; slots below the capacity are filled (in no particular order), the other rows are
//         held in `residual` (in place: the rows it held are cleared as they are added in). `residual_rows`, on
//         the device, counts the rows held: at 0 (every step whose rows all fit, the usual case) the residual is
//         neither read nor cleared, so it costs nothing; after the launch it is set to the rows this pack held.
//         The headers are counted in a small int32 array and copied into the buffers' header rows after the
//         launch (a float16 row may start on a 2-byte boundary). No host sync.
//         `visible` (optional, [N] int32, the render's screen radii): the caller's word that every row where it is
//         0 holds zeros (a culled splat's gradient). cub first lists the rows in view; unless most rows are,
//         the pack then reads those alone (one by one, into tiles of listed rows), not the others. Not used while
//         the residual holds rows (those may lie outside the view).
//         `send_in_view` (with `visible`, one owner, no residual: the capacity holds every row): where the rows in
//         view are listed, every one of them is sent, zeros included, listed row i in slot i (the count is the
//         rows in view): no test of a row's values and no atomic, each thread moving single values.
//         `clear`: every row read that is not bitwise zero (a touched row, or one of -0.0s) is zeroed in the
//         gradients, so that after the launch they are all zeros and the unpack need not zero them; with
//         `own_scale` (not 0) each row sent is written back instead as own_scale x its values as the other ranks
//         decode them (float16 rounding included; -0.0 as +0.0), the rows held back and those of -0.0s as zeros:
//         the rank's own share of the unpack's sums, in place (with two ranks the sums are then the same bits
//         either way round: a + b = b + a, and a row one rank did not send is +0.0 there, so +0.0 + -0.0 on one
//         rank meets +0.0 on the other).
// unpack: the gradients zeroed (unless the caller says they are zeros already: `zeroed`, after a `clear` pack),
//         then every rank's sent rows, times `scale`, added in (at row index / index_divisor:
//         into an owner's slice, index_divisor = W; the first rank's written into the zeros without reading them,
//         0 + x being x). A row appears once per buffer, so no two threads add to the same value; ranks are
//         unpacked one launch after another, in rank order, which makes the sums bitwise the same on every rank.
//         `own_rank` (>= 0): that rank's rows are in the gradients already (a pack with `own_scale` left them), so
//         its buffer is skipped and the others' rows are added to what the gradients hold (nothing zeroed first).
//         Products and sums are rounded one by one (no fused multiply-add), so own_scale x a + scale x b is the
//         same bits on the rank that sent a and on the one that sent b.
//         The ranks' header rows come back as one small [ranks, kHeaderInts] tensor (a copy each, no kernel).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace bytesplat {

constexpr int kMaxParts = 8;
constexpr int kHeaderInts = 3;
constexpr int kMaxOwners = 256;  // the pack kernel's first block writes every owner's note
constexpr int kPackTileBytes = 32 * 1024;  // shared memory for one pack block's tile of rows

struct RowParts {
  float* ptr[kMaxParts];  // [N, width[p]] each, row r at ptr + r * stride[p]
  int width[kMaxParts];
  int64_t stride[kMaxParts];  // values from one row's start to the next's: width[p] where contiguous
  int parts;
  int64_t rows;  // N
  int values;    // D
};

struct PackParams {
  RowParts grads;             // read
  float* residual;            // [N, D] the rows held (added in), then the rows past the capacity; or nullptr
                              // (each value is read, then written, by the same lane); zeros elsewhere
  const int* residual_rows;   // [1] how many rows `residual` holds (0: it is all zeros, not read)
  const int32_t* visible;     // [N] or nullptr: rows where it is 0 hold zeros and need not be read
  int32_t* listed;            // [N] with `visible`: the rows in view, listed in row order before the pack
  void* list_temp;            // list_rows_temp_bytes(N) bytes of scratch for the listing
  size_t list_temp_bytes;
  bool clear;                 // zero the gradient rows read that are not bitwise zero
  float own_scale;            // with clear, not 0: write the rows sent back as own_scale x their sent values
  bool send_in_view;          // with visible, one owner, no residual: rows listed in view all sent, in list order
  void* buffer;               // [owners, capacity + 1, slots + D]; the header rows written after the launch
  int* headers;               // [owners * kHeaderInts + 2] zeroed before the launch: counts (atomic) and notes,
                              // then the rows this pack held in `residual` (atomic), the rows listed (atomic)
  bool half;
  int capacity;
  int owners;
  int note;
  int index_scale;
  int index_offset;
};

struct UnpackParams {
  RowParts grads;      // += scale * the rows' values
  const void* buffer;  // one rank's [capacity + 1, slots + D]
  bool half;
  int capacity;
  float scale;
  int index_divisor;
  bool first;  // the first rank unpacked: its rows go into zeros, written without reading them
};

size_t list_rows_temp_bytes(int64_t rows);  // the scratch the listing of the rows in view needs
cudaError_t launch_pack_rows(const PackParams& p, cudaStream_t stream);
cudaError_t launch_unpack_rows(const UnpackParams& p, cudaStream_t stream);

}  // namespace bytesplat

#ifndef __CUDACC__
#include "common.h"

namespace bytesplat {

// -> buffers [owners, capacity + 1, slots + D] (float32, or float16 with `half`).
// Gradients: each [N, ...] float32 contiguous, or [N, w] with its columns next to each other (a view of every row's
// first w values).
// `out`: the buffers' tensor to write (a rank's slice of the all-gather's output, which spares NCCL the local
// copy), else a new one.
at::Tensor pack_rows(const std::vector<at::Tensor>& grads,             // read (with clear: zeroed, or own rows)
                     const c10::optional<at::Tensor>& residual,       // [N, D] float32, read and written
                     const c10::optional<at::Tensor>& residual_rows,  // [1] int32, read and written
                     const c10::optional<at::Tensor>& visible,        // [N] int32
                     const c10::optional<at::Tensor>& out,            // [owners, capacity + 1, slots + D]
                     int64_t capacity, int64_t note, bool half, int64_t owners, int64_t index_scale,
                     int64_t index_offset, bool clear, double own_scale, bool send_in_view);

// grads[p] = scale * the sum of every rank's rows in `buffers` (one per rank, each [capacity + 1, slots + D]: slices
// of an all-gather's output, or peers' regions mapped here, peer_memory.h), added in rank order (`zeroed`: grads
// hold zeros already; `own_rank` >= 0: they hold that rank's rows, scaled, and the others' are added to them).
// -> the ranks' headers [ranks, kHeaderInts] int32 (row count, note, third value).
at::Tensor unpack_rows(const std::vector<at::Tensor>& grads, const std::vector<at::Tensor>& buffers,
                       int64_t capacity, double scale, int64_t index_divisor, bool zeroed, int64_t own_rank);

}  // namespace bytesplat
#endif
