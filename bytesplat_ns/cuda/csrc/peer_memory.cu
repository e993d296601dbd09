// The barrier kernel among the ranks of one machine (peer_memory.h).
#include <cuda/atomic>

#include <cstdio>

#include "peer_memory.h"

namespace bytesplat {
namespace {

__device__ uint64_t now_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__global__ void peer_barrier_kernel(const BarrierParams p) {
  __shared__ uint32_t epoch;
  if (threadIdx.x == 0) {
    epoch = p.counter[p.channel] + 1;
    p.counter[p.channel] = epoch;
  }
  __syncthreads();
  const int peer = threadIdx.x;
  if (peer >= p.world || peer == p.rank) return;
  // Arrive: what this GPU wrote before (the pack's rows) is visible system-wide before the peer sees the epoch.
  cuda::atomic_thread_fence(cuda::memory_order_seq_cst, cuda::thread_scope_system);
  cuda::atomic_ref<uint32_t, cuda::thread_scope_system> arrived(p.flags[peer][p.channel * kMaxPeerRanks + p.rank]);
  arrived.store(epoch, cuda::memory_order_release);
  // Wait for the peer's arrival at this epoch (epochs only grow; the difference is taken to survive a wrap). The
  // exchange alternates its two channels (FREE, READY), so a peer cannot be past this epoch: it would have passed
  // the other channel's next barrier, which waits for this rank. Past it, the ranks have run their barriers a
  // different number of times, and every later wait would pass unordered: fail instead.
  cuda::atomic_ref<uint32_t, cuda::thread_scope_system> theirs(p.flags[p.rank][p.channel * kMaxPeerRanks + peer]);
  const uint64_t start = now_ns();
  for (int32_t ahead; (ahead = static_cast<int32_t>(theirs.load(cuda::memory_order_acquire) - epoch)) != 0;) {
    if (ahead > 0) {
      printf("bytesplat peer barrier: rank %d is at epoch %u of channel %d and rank %d already %d past it: the ranks "
             "ran their exchanges a different number of times\n", p.rank, epoch, p.channel, peer, ahead);
      __trap();
    }
    if (now_ns() - start > p.timeout_ns) {
      printf("bytesplat peer barrier: rank %d waited %.0f s for rank %d at channel %d, epoch %u; it has stopped\n",
             p.rank, p.timeout_ns * 1e-9, peer, p.channel, epoch);
      __trap();
    }
    __nanosleep(100);
  }
}

}  // namespace

cudaError_t launch_peer_barrier(const BarrierParams& p, cudaStream_t stream) {
  peer_barrier_kernel<<<1, 32, 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace bytesplat
