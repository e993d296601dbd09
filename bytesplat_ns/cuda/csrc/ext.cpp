// The one binding file: the extension's Python functions.
#include "adam.h"
#include "bin_tiles.h"
#include "common.h"
#include "peer_memory.h"
#include "prune_tiles.h"
#include "rasterize_forward.h"
#include "rasterize_fused.h"
#include "scale_grads.h"
#include "sh.h"
#include "sparse_rows.h"
#include "ssim.h"

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "bytesplat kernels: fused rasterizer, exchange rows, SSIM, SH, Adam, gradient scaling";
  m.def("bin_tiles", &bytesplat::bin_tiles, "Tile binning into buffers of a given capacity, no host sync");
  m.def("tile_ranges", &bytesplat::tile_ranges, "Tile list ends, with on-chip pruning of overflowing tiles");
  m.def("rasterize_forward", &bytesplat::rasterize_forward, "Forward compositing per 16x16 or 8x8 tile");
  m.def("rasterize_backward", &bytesplat::rasterize_backward,
        "Fused forward + backward from dL/d render and dL/d alpha");
  m.def("rasterize_loss", &bytesplat::rasterize_loss, "Fused forward + in-kernel L1/L2 loss + backward");
  m.def("fused_capacity", &bytesplat::fused_capacity, "Splats per tile held on-chip by the fused kernel");
  m.def("pack_rows", &bytesplat::pack_rows, "The exchange's non-zero gradient rows into one buffer");
  m.def("unpack_rows", &bytesplat::unpack_rows, "Every rank's exchanged rows, scaled and summed into the zeroed gradients; returns the headers");
  m.def("peer_region", &bytesplat::peer_region, "A region of device memory other processes can map (CUDA IPC)");
  m.def("peer_handle", &bytesplat::peer_handle, "The IPC handle of a peer region");
  m.def("open_peer_region", &bytesplat::open_peer_region, "Another process's peer region, mapped here");
  m.def("peer_barrier", &bytesplat::peer_barrier, "A barrier among the ranks of one machine, on the GPU");
  m.def("ssim_forward", &bytesplat::ssim_forward, "SSIM per block and its derivatives w.r.t. the moments of y");
  m.def("ssim_backward", &bytesplat::ssim_backward, "dSSIM/dy from the forward's derivative maps");
  m.def("scale_grads", &bytesplat::scale_grads, "Gradients times a device scalar in place, in one launch; nothing done when it is 1");
  m.def("sh_forward", &bytesplat::sh_forward, "Colour from spherical harmonics per splat (degrees 0-3), one launch");
  m.def("sh_backward", &bytesplat::sh_backward, "dL/ddc, dL/drest and dL/ddirs of sh_forward, one launch");
  m.def("adam_step", &bytesplat::adam_step, "Adam over every parameter group in one launch");
}
