// Device memory that the ranks of one machine read from each other directly (peer_rows.py), and a barrier among
// them that runs on the GPU, so that both can sit inside a CUDA graph with no host in between.
//
// Memory: each rank cudaMallocs one region and hands its CUDA IPC handle to the others, which map it into their
// own address space (cudaIpcOpenMemHandle, peer access enabled as needed; on one GPU, two processes share it the
// same way). A kernel then reads a peer's region as it reads its own memory (over NVLink between two GPUs).
//
// Barrier: every region starts with kPeerFlagBytes of flags, uint32 flags[kPeerChannels][kMaxPeerRanks]: slot
// [c][r] of rank q's region is the last epoch at which rank r arrived at channel c, as rank q sees it. A barrier on
// channel c takes the next epoch from this rank's own counter (local memory, [kPeerChannels] uint32, advanced by the
// kernel itself, so a graph replays it correctly), then, for each peer p (one thread each): a system-wide fence (the
// writes of the kernels before it, on this GPU, reach every reader), a release store of the epoch into slot [c][rank]
// of p's region, then spins with acquire loads until slot [c][p] of its own region reaches the epoch. Every rank runs
// the same barriers in the same order (the exchange runs the same steps everywhere), so their epochs agree. A peer
// that never arrives (it died) fails the kernel after `timeout_s` with a message, instead of spinning forever.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace bytesplat {

constexpr int kMaxPeerRanks = 8;
constexpr int kPeerChannels = 4;
constexpr int64_t kPeerFlagBytes = 256;  // the flags, padded so the rows after them start 256-byte aligned
static_assert(kMaxPeerRanks * kPeerChannels * 4 <= kPeerFlagBytes, "the flags must fit before the rows");

struct BarrierParams {
  uint32_t* flags[kMaxPeerRanks];  // every rank's region as mapped here (this rank's own at [rank])
  uint32_t* counter;               // [kPeerChannels] this rank's epochs
  int channel;
  int rank;
  int world;
  uint64_t timeout_ns;
};

cudaError_t launch_peer_barrier(const BarrierParams& p, cudaStream_t stream);

}  // namespace bytesplat

#ifndef __CUDACC__
#include "common.h"

namespace bytesplat {

// -> [bytes] uint8 on `device`: a region of its own cudaMalloc (an IPC handle names a whole allocation), its
// flags zeroed; freed when the tensor is.
at::Tensor peer_region(int64_t bytes, int64_t device);

// -> [CUDA_IPC_HANDLE_SIZE] uint8 on the CPU: the IPC handle of a region from peer_region.
at::Tensor peer_handle(const at::Tensor& region);

// -> [bytes] uint8 on `device`: another process's region, mapped here from its handle; unmapped when the tensor
// is freed.
at::Tensor open_peer_region(const at::Tensor& handle, int64_t bytes, int64_t device);

// The barrier above, launched on the current stream: `regions` are every rank's region as mapped here, in rank
// order; `counter` [kPeerChannels] int32 on this rank's device, zeroed when the regions were made.
void peer_barrier(const std::vector<at::Tensor>& regions, const at::Tensor& counter, int64_t channel, int64_t rank,
                  double timeout_s);

}  // namespace bytesplat
#endif
