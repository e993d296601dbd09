// Host side of the peer memory (peer_memory.h): regions, their IPC handles, the barrier's launch.
#include "peer_memory.h"

#include <cstring>

namespace bytesplat {
namespace {

// [bytes] uint8 over device memory at `ptr` on `device`, handed back by `release` (cudaFree for a region of this
// process, cudaIpcCloseMemHandle for a peer's mapping) when the tensor is freed. The device is given, not looked up
// from the pointer: a peer's mapping reports the GPU its memory lies on, not the one that maps it.
at::Tensor device_bytes(void* ptr, int64_t bytes, int64_t device, cudaError_t (*release)(void*)) {
  const at::Device here(at::kCUDA, static_cast<c10::DeviceIndex>(device));
  const auto options = at::TensorOptions().dtype(at::kByte).device(here);
  return at::from_blob(
      ptr, {bytes},
      [device, release](void* p) {
        const c10::cuda::CUDAGuard release_guard(static_cast<c10::DeviceIndex>(device));
        release(p);
      },
      options, here);
}

}  // namespace

at::Tensor peer_region(int64_t bytes, int64_t device) {
  BYTESPLAT_CHECK(bytes > kPeerFlagBytes, "a peer region holds its ", kPeerFlagBytes, " bytes of flags and rows");
  const c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device));
  void* ptr = nullptr;
  BYTESPLAT_CHECK_CUDA_STATUS(cudaMalloc(&ptr, bytes));
  BYTESPLAT_CHECK_CUDA_STATUS(cudaMemset(ptr, 0, kPeerFlagBytes));
  return device_bytes(ptr, bytes, device, cudaFree);
}

at::Tensor peer_handle(const at::Tensor& region) {
  BYTESPLAT_CHECK_INPUT(region, at::kByte);
  const c10::cuda::CUDAGuard guard(region.device());
  cudaIpcMemHandle_t handle;
  BYTESPLAT_CHECK_CUDA_STATUS(cudaIpcGetMemHandle(&handle, region.data_ptr()));
  at::Tensor out = at::empty({static_cast<int64_t>(sizeof(handle))}, at::kByte);
  std::memcpy(out.data_ptr(), &handle, sizeof(handle));
  return out;
}

at::Tensor open_peer_region(const at::Tensor& handle, int64_t bytes, int64_t device) {
  BYTESPLAT_CHECK(handle.device().is_cpu() && handle.scalar_type() == at::kByte && handle.is_contiguous() &&
                      handle.numel() == static_cast<int64_t>(sizeof(cudaIpcMemHandle_t)),
                  "handle must be the ", sizeof(cudaIpcMemHandle_t), " bytes peer_handle gave, on the CPU");
  const c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device));
  cudaIpcMemHandle_t h;
  std::memcpy(&h, handle.data_ptr(), sizeof(h));
  void* ptr = nullptr;
  BYTESPLAT_CHECK_CUDA_STATUS(cudaIpcOpenMemHandle(&ptr, h, cudaIpcMemLazyEnablePeerAccess));
  return device_bytes(ptr, bytes, device, cudaIpcCloseMemHandle);
}

void peer_barrier(const std::vector<at::Tensor>& regions, const at::Tensor& counter, int64_t channel, int64_t rank,
                  double timeout_s) {
  const int64_t world = static_cast<int64_t>(regions.size());
  BYTESPLAT_CHECK(world >= 1 && world <= kMaxPeerRanks, "between 1 and ", kMaxPeerRanks, " ranks read each other's ",
                  "rows directly, got ", world);
  BYTESPLAT_CHECK(rank >= 0 && rank < world, "rank must be one of the ", world, " ranks, got ", rank);
  BYTESPLAT_CHECK(channel >= 0 && channel < kPeerChannels, "channel must be below ", kPeerChannels);
  BYTESPLAT_CHECK_INPUT(counter, at::kInt);
  check_shape(counter, {kPeerChannels}, "counter");
  const c10::cuda::CUDAGuard guard(counter.device());
  BarrierParams p{};
  for (int64_t r = 0; r < world; ++r) {
    BYTESPLAT_CHECK_INPUT(regions[r], at::kByte);
    BYTESPLAT_CHECK(regions[r].device() == counter.device() && regions[r].numel() > kPeerFlagBytes,
                    "every region must be mapped on ", counter.device(), " and hold its flags");
    p.flags[r] = static_cast<uint32_t*>(regions[r].data_ptr());
  }
  p.counter = reinterpret_cast<uint32_t*>(counter.data_ptr<int>());
  p.channel = static_cast<int>(channel);
  p.rank = static_cast<int>(rank);
  p.world = static_cast<int>(world);
  p.timeout_ns = static_cast<uint64_t>(timeout_s * 1e9);
  BYTESPLAT_CHECK_CUDA_STATUS(launch_peer_barrier(p, c10::cuda::getCurrentCUDAStream().stream()));
}

}  // namespace bytesplat
