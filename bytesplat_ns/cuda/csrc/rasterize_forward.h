// Forward rasterization: front-to-back compositing per 16x16 or 8x8 tile, keeping the state a backward resumes
// from when asked (PassState).
#pragma once

#include <cuda_runtime_api.h>

#include "raster_types.h"

namespace bytesplat {

struct ForwardParams {
  SplatInputs splats;
  TileLists tiles;
  int width;
  int height;
  float* render;  // [H, W, CDIM] premultiplied colour (no background)
  float* alpha;   // [H, W] 1 - final transmittance
  PassState keep;  // kept for a backward that resumes (its render: the one above), or all null
};

// Launches on `stream`; cdim is 3 (RGB) or 4 (RGB + depth). Returns the launch status.
cudaError_t launch_rasterize_forward(const ForwardParams& p, int cdim, cudaStream_t stream);

}  // namespace bytesplat

#ifndef __CUDACC__
#include "common.h"

namespace bytesplat {

// -> [render [H, W, D], alpha [H, W, 1], transmittance [H, W], last [H, W] int32, bits [pass_bits_size] int32],
// the last three empty unless keep_state (PassState). poison first fills the images and the transmittance with NaN,
// `last` with -1 and the bits with zeros (tests: a value not written, or a bit not set, fails).
std::vector<at::Tensor> rasterize_forward(const at::Tensor& means2d,      // [N, 2]
                                          const at::Tensor& conics,       // [N, 3]
                                          const at::Tensor& colors,       // [N, D]
                                          const at::Tensor& opacities,    // [N]
                                          const at::Tensor& tile_start,   // [T] int32
                                          const at::Tensor& tile_end,     // [T] int32
                                          const at::Tensor& flatten_ids,  // [M] int32
                                          int64_t width, int64_t height, int64_t tiles_x, int64_t tile_size,
                                          bool keep_state, bool poison);

}  // namespace bytesplat
#endif
