// Torch-side helpers shared by the host wrappers (.cpp): input checks, device guard, pointer structs.
#pragma once

#include <c10/cuda/CUDAStream.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/extension.h>

#include <initializer_list>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include "raster_types.h"

namespace bytesplat {
namespace detail {

// One part of an error message as text, without iostreams (see BYTESPLAT_CHECK).
inline std::string text(const char* s) { return s; }
inline std::string text(const std::string& s) { return s; }
template <typename T, std::enable_if_t<std::is_arithmetic_v<T>, int> = 0>
std::string text(T value) {
  return std::to_string(value);
}
inline std::string text(at::ScalarType type) { return c10::toString(type); }
inline std::string text(const c10::Device& device) {
  return device.is_cuda() ? "cuda:" + std::to_string(device.index()) : (device.is_cpu() ? "cpu" : "another device");
}
inline std::string text(at::IntArrayRef sizes) {
  std::string out = "[";
  for (size_t i = 0; i < sizes.size(); ++i) out += (i ? ", " : "") + std::to_string(sizes[i]);
  return out + "]";
}

}  // namespace detail

// The parts of an error message, joined into one string.
template <typename... Parts>
std::string message(const Parts&... parts) {
  std::string out;
  ((out += detail::text(parts)), ...);
  return out;
}

}  // namespace bytesplat

// TORCH_CHECK with the message joined here, without iostreams, and handed to torch as one C string. On the H200
// machine (torch 2.11.0+cu130) a failing check whose message streamed several parts through std::ostringstream,
// as TORCH_CHECK's own formatting does, crashed the process (segmentation fault) instead of raising; a check with
// one C-string message raised RuntimeError as it should (benchmarks/RESULTS.md, twelfth session).
#define BYTESPLAT_CHECK(cond, ...)                                    \
  do {                                                                \
    if (C10_UNLIKELY(!(cond))) {                                      \
      const std::string message_ = ::bytesplat::message(__VA_ARGS__); \
      TORCH_CHECK(false, message_.c_str());                           \
    }                                                                 \
  } while (0)

#define BYTESPLAT_CHECK_INPUT(x, dtype)                                                         \
  BYTESPLAT_CHECK((x).is_cuda(), #x " must be a CUDA tensor");                                     \
  BYTESPLAT_CHECK((x).is_contiguous(), #x " must be contiguous");                                  \
  BYTESPLAT_CHECK((x).scalar_type() == (dtype), #x " must be ", (dtype), ", got ", (x).scalar_type())

#define BYTESPLAT_CHECK_CUDA_STATUS(expr)                                                       \
  do {                                                                                          \
    const cudaError_t status_ = (expr);                                                         \
    BYTESPLAT_CHECK(status_ == cudaSuccess, #expr " failed: ", cudaGetErrorString(status_));        \
  } while (0)

namespace bytesplat {

inline void check_shape(const at::Tensor& t, std::initializer_list<int64_t> shape, const char* name) {
  BYTESPLAT_CHECK(t.sizes() == at::IntArrayRef(shape), name, " has shape ", t.sizes(), ", expected ",
              at::IntArrayRef(shape));
}

// The colour channels the rasterization kernels take: 3 (RGB) or 4 (RGB + depth).
inline int64_t check_channels(int64_t cdim) {
  BYTESPLAT_CHECK(cdim == 3 || cdim == 4, "the fused rasterizer takes 3 or 4 channels, got ", cdim);
  return cdim;
}

// Checks the projected splats (float32, contiguous, same device, consistent N) and points at them.
inline SplatInputs splat_inputs(const at::Tensor& means2d, const at::Tensor& conics, const at::Tensor& colors,
                                const at::Tensor& opacities) {
  BYTESPLAT_CHECK_INPUT(means2d, at::kFloat);
  BYTESPLAT_CHECK_INPUT(conics, at::kFloat);
  BYTESPLAT_CHECK_INPUT(colors, at::kFloat);
  BYTESPLAT_CHECK_INPUT(opacities, at::kFloat);
  const int64_t n = means2d.size(0);
  check_shape(means2d, {n, 2}, "means2d");
  check_shape(conics, {n, 3}, "conics");
  BYTESPLAT_CHECK(colors.dim() == 2 && colors.size(0) == n, "colors must be [N, D] with N = ", n);
  check_shape(opacities, {n}, "opacities");
  return SplatInputs{means2d.data_ptr<float>(), conics.data_ptr<float>(), colors.data_ptr<float>(),
                     opacities.data_ptr<float>()};
}

// The tile side the kernels are instantiated for: 16 or 8 pixels.
inline int check_tile_size(int64_t tile_size) {
  BYTESPLAT_CHECK(tile_size == kTileLarge || tile_size == kTileSmall, "tile_size must be ", kTileLarge, " or ",
              kTileSmall, " (the sides the kernels are built for), got ", tile_size,
              "; bytesplat_ns.cuda.ops.tile_size_for picks one for an image size");
  return static_cast<int>(tile_size);
}

// Checks tile lists: start/end [tiles_y * tiles_x] int32 and the int32 entry ids, on tiles of `tile_size` pixels.
inline TileLists tile_lists(const at::Tensor& start, const at::Tensor& end, const at::Tensor& ids, int64_t width,
                            int64_t height, int64_t tiles_x, int64_t tile_size) {
  BYTESPLAT_CHECK_INPUT(start, at::kInt);
  BYTESPLAT_CHECK_INPUT(end, at::kInt);
  BYTESPLAT_CHECK_INPUT(ids, at::kInt);
  const int tile = check_tile_size(tile_size);
  const int64_t tiles_y = (height + tile - 1) / tile;
  BYTESPLAT_CHECK(width > 0 && height > 0, "image size must be positive");
  BYTESPLAT_CHECK(tiles_x == (width + tile - 1) / tile, "tiles_x = ", tiles_x, " does not match width ", width,
              " with ", tile, "-pixel tiles (expected ", (width + tile - 1) / tile, ")");
  check_shape(start, {tiles_y * tiles_x}, "tile_start");
  check_shape(end, {tiles_y * tiles_x}, "tile_end");
  return TileLists{start.data_ptr<int32_t>(), end.data_ptr<int32_t>(), ids.data_ptr<int32_t>(),
                   static_cast<int>(tiles_x), static_cast<int>(tiles_y), tile};
}

// An output image [H, W, channels]: uninitialised, or NaN when poisoned (tests catch unwritten values).
inline at::Tensor image_output(const at::Tensor& like, int64_t height, int64_t width, int64_t channels,
                               bool poison) {
  at::Tensor out = at::empty({height, width, channels}, like.options().dtype(at::kFloat));
  if (poison) out.fill_(std::numeric_limits<float>::quiet_NaN());
  return out;
}

}  // namespace bytesplat
