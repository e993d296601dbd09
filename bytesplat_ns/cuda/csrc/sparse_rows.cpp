// Host side of the exchange's row packing: checks, allocation, launches on the current stream.
#include "sparse_rows.h"

#include <algorithm>

namespace bytesplat {
namespace {

// Checks the gradients (float32, one device, one N; contiguous, or [N, w] views of each row's first w values) and
// points at them as [N, width] parts.
RowParts row_parts(const std::vector<at::Tensor>& grads) {
  BYTESPLAT_CHECK(!grads.empty() && grads.size() <= static_cast<size_t>(kMaxParts), "between 1 and ", kMaxParts,
              " gradients, got ", grads.size());
  RowParts parts{};
  parts.rows = grads[0].size(0);
  parts.parts = static_cast<int>(grads.size());
  for (size_t q = 0; q < grads.size(); ++q) {
    const at::Tensor& g = grads[q];
    BYTESPLAT_CHECK(g.is_cuda() && g.scalar_type() == at::kFloat, "every gradient must be a float32 CUDA tensor");
    BYTESPLAT_CHECK(g.dim() >= 1 && g.size(0) == parts.rows, "every gradient must have ", parts.rows, " rows");
    BYTESPLAT_CHECK(g.device() == grads[0].device(), "every gradient must be on ", grads[0].device());
    const bool leading = !g.is_contiguous() && g.dim() == 2 && g.stride(1) == 1 && g.stride(0) >= g.size(1);
    BYTESPLAT_CHECK(g.is_contiguous() || leading, "every gradient must be contiguous, or an [N, w] view of each ",
                    "row's first w values (row stride >= w, column stride 1)");
    parts.ptr[q] = g.data_ptr<float>();
    parts.width[q] = static_cast<int>(parts.rows > 0 ? g.numel() / parts.rows : 0);
    parts.stride[q] = leading ? g.stride(0) : parts.width[q];
    parts.values += parts.width[q];
  }
  return parts;
}

int64_t row_slots(bool half) { return half ? 2 : 1; }

// A buffer row's bytes must hold the header's ints.
void check_header_fits(int64_t values, bool half) {
  const int64_t bytes = (row_slots(half) + values) * (half ? 2 : 4);
  BYTESPLAT_CHECK(bytes >= kHeaderInts * 4, "rows of ", values, " values are too narrow for the ", kHeaderInts,
                  " header ints; exchange gradients of at least ", half ? 4 : 2, " values per row");
}

}  // namespace

at::Tensor pack_rows(const std::vector<at::Tensor>& grads, const c10::optional<at::Tensor>& residual,
                     const c10::optional<at::Tensor>& residual_rows, const c10::optional<at::Tensor>& visible,
                     const c10::optional<at::Tensor>& out, int64_t capacity, int64_t note, bool half, int64_t owners,
                     int64_t index_scale, int64_t index_offset, bool clear, double own_scale, bool send_in_view) {
  const RowParts parts = row_parts(grads);
  const c10::cuda::CUDAGuard guard(grads[0].device());
  BYTESPLAT_CHECK(owners >= 1 && owners <= kMaxOwners, "owners must be between 1 and ", kMaxOwners, ", got ", owners);
  BYTESPLAT_CHECK(capacity >= 1 && owners * (capacity + 1) < (int64_t{1} << 31),
                  "capacity must be positive and owners x (capacity + 1) an int32");
  BYTESPLAT_CHECK(capacity >= (parts.rows + owners - 1) / owners || residual.has_value(),
                  "a capacity below an owner's row count needs a residual for the rows that do not fit");
  BYTESPLAT_CHECK(residual.has_value() == residual_rows.has_value(),
                  "a residual and its row count (residual_rows) come together");
  check_header_fits(parts.values, half);
  BYTESPLAT_CHECK(parts.values <= kPackTileBytes / 4, "the pack kernel's tile holds rows of at most ",
                  kPackTileBytes / 4, " values, got ", parts.values);
  BYTESPLAT_CHECK(index_scale >= 1 && index_offset >= 0 &&
                      std::max<int64_t>(parts.rows - 1, 0) * index_scale + index_offset < (int64_t{1} << 31),
                  "the written row indices must be int32: index_scale >= 1, index_offset >= 0");
  if (residual.has_value()) {
    BYTESPLAT_CHECK_INPUT(residual.value(), at::kFloat);
    check_shape(residual.value(), {parts.rows, parts.values}, "residual");
    BYTESPLAT_CHECK_INPUT(residual_rows.value(), at::kInt);
    check_shape(residual_rows.value(), {1}, "residual_rows");
  }
  if (visible.has_value()) {
    BYTESPLAT_CHECK_INPUT(visible.value(), at::kInt);
    check_shape(visible.value(), {parts.rows}, "visible (the render's screen radii of one camera)");
  }
  BYTESPLAT_CHECK(own_scale == 0 || clear, "own_scale writes the sent rows back in place of clear's zeros: ",
                  "pass clear=True with it");
  BYTESPLAT_CHECK(!send_in_view || (visible.has_value() && owners == 1 && !residual.has_value()),
                  "send_in_view sends every row in view into one buffer that holds them all: pass `visible`, ",
                  "owners=1 and no residual with it (or send_in_view=False)");
  const auto dtype = half ? at::kHalf : at::kFloat;
  const int64_t width = row_slots(half) + parts.values;
  at::Tensor buffer;
  if (out.has_value()) {
    BYTESPLAT_CHECK_INPUT(out.value(), dtype);
    check_shape(out.value(), {owners, capacity + 1, width}, "out (the buffers)");
    BYTESPLAT_CHECK(out->device() == grads[0].device(), "out must be on the gradients' device ", grads[0].device());
    buffer = out.value();
  } else {
    buffer = at::empty({owners, capacity + 1, width}, grads[0].options().dtype(dtype));
  }
  at::Tensor headers = at::zeros({owners * kHeaderInts + 2}, grads[0].options().dtype(at::kInt));
  at::Tensor listed, list_temp;
  if (visible.has_value()) {
    listed = at::empty({parts.rows}, headers.options());
    list_temp = at::empty({static_cast<int64_t>(list_rows_temp_bytes(parts.rows))}, headers.options().dtype(at::kByte));
  }
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream().stream();
  const PackParams p{parts,
                     residual.has_value() ? residual->data_ptr<float>() : nullptr,
                     residual_rows.has_value() ? residual_rows->data_ptr<int>() : nullptr,
                     visible.has_value() ? visible->data_ptr<int32_t>() : nullptr,
                     visible.has_value() ? listed.data_ptr<int32_t>() : nullptr,
                     visible.has_value() ? list_temp.data_ptr() : nullptr,
                     visible.has_value() ? static_cast<size_t>(list_temp.numel()) : 0,
                     clear,
                     static_cast<float>(own_scale),
                     send_in_view,
                     buffer.data_ptr(),
                     headers.data_ptr<int>(),
                     half,
                     static_cast<int>(capacity),
                     static_cast<int>(owners),
                     static_cast<int>(note),
                     static_cast<int>(index_scale),
                     static_cast<int>(index_offset)};
  BYTESPLAT_CHECK_CUDA_STATUS(launch_pack_rows(p, stream));
  const int64_t owner_bytes = (capacity + 1) * width * buffer.element_size();
  BYTESPLAT_CHECK_CUDA_STATUS(cudaMemcpy2DAsync(buffer.data_ptr(), owner_bytes, headers.data_ptr(),
                                                kHeaderInts * sizeof(int32_t), kHeaderInts * sizeof(int32_t), owners,
                                                cudaMemcpyDeviceToDevice, stream));
  if (residual_rows.has_value()) {  // after the launch: every block has read the count it started with
    BYTESPLAT_CHECK_CUDA_STATUS(cudaMemcpyAsync(residual_rows->data_ptr<int>(), headers.data_ptr<int>() + owners *
                                                kHeaderInts, sizeof(int32_t), cudaMemcpyDeviceToDevice, stream));
  }
  return buffer;
}

at::Tensor unpack_rows(const std::vector<at::Tensor>& grads, const std::vector<at::Tensor>& buffers,
                       int64_t capacity, double scale, int64_t index_divisor, bool zeroed, int64_t own_rank) {
  const RowParts parts = row_parts(grads);
  const c10::cuda::CUDAGuard guard(grads[0].device());
  const int64_t ranks = static_cast<int64_t>(buffers.size());
  BYTESPLAT_CHECK(ranks >= 1, "unpack_rows needs every rank's buffer, got none");
  const bool half = buffers[0].scalar_type() == at::kHalf;
  const int64_t width = row_slots(half) + parts.values;
  for (const at::Tensor& buffer : buffers) {
    BYTESPLAT_CHECK_INPUT(buffer, half ? at::kHalf : at::kFloat);
    check_shape(buffer, {capacity + 1, width}, "each rank's buffer");
    BYTESPLAT_CHECK(buffer.device() == grads[0].device(), "every buffer must be on (or mapped to) the gradients' ",
                    "device ", grads[0].device());
  }
  check_header_fits(parts.values, half);
  BYTESPLAT_CHECK(index_divisor >= 1 && index_divisor < (int64_t{1} << 31), "index_divisor must be a positive int32");
  BYTESPLAT_CHECK(own_rank < ranks, "own_rank must be one of the ", ranks, " ranks gathered, or -1 for none");
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream().stream();
  for (at::Tensor g : grads) {
    if (zeroed || own_rank >= 0) break;  // a `clear` pack left them zero, or holding this rank's rows
    if (g.is_contiguous()) {
      BYTESPLAT_CHECK_CUDA_STATUS(cudaMemsetAsync(g.data_ptr(), 0, g.numel() * sizeof(float), stream));
    } else {
      g.zero_();  // a view of each row's leading values: those alone
    }
  }
  for (int64_t r = 0; r < ranks; ++r) {  // in rank order: the same sums on every rank
    if (r == own_rank) continue;  // in the gradients already
    const UnpackParams p{parts, buffers[r].data_ptr(), half, static_cast<int>(capacity), static_cast<float>(scale),
                         static_cast<int>(index_divisor), r == 0 && own_rank < 0};
    BYTESPLAT_CHECK_CUDA_STATUS(launch_unpack_rows(p, stream));
  }
  at::Tensor headers = at::empty({ranks, kHeaderInts}, grads[0].options().dtype(at::kInt));
  for (int64_t r = 0; r < ranks; ++r) {  // each rank's header row (a peer's read where it lies)
    BYTESPLAT_CHECK_CUDA_STATUS(cudaMemcpyAsync(headers.data_ptr<int32_t>() + r * kHeaderInts, buffers[r].data_ptr(),
                                                kHeaderInts * sizeof(int32_t), cudaMemcpyDeviceToDevice, stream));
  }
  return headers;
}

}  // namespace bytesplat
