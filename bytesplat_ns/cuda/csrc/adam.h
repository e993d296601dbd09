// Adam over every parameter group in one launch (bytesplat_ns/adam_all_groups.py).
//
// The groups' elements are laid end to end, four at a time, and walked by one grid; each thread's four find their
// group from the cumulative counts and move as one 16-byte load and store per tensor where the group's tensors
// are 16-byte aligned and the four fall inside it (else, and for rows masked by `visible`, one at a time). The
// arithmetic is torch's fused Adam (no weight decay, amsgrad or maximize):
//   m = b1 m + (1 - b1) g,  v = b2 v + (1 - b2) g^2,  p -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)
// with t = step + 1 read from each group's step tensor (torch's state["step"], float32 on the device) and the
// learning rates read from a device tensor, so the launch can be recorded in a CUDA graph and replayed with new
// rates. The last block to finish adds 1 to every group's step (after every block has read it) and re-arms the
// block counter. With `visible`, a group whose rows are splats (row_width > 0) updates only the rows of visible
// splats; the others keep their parameters and moments (the step count still advances). With `skip` set on the
// device (a step whose loss or gradients the non-finite guard found not finite) the launch changes nothing: every
// block returns at once, the step counts stay.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace bytesplat {

constexpr int kMaxAdamGroups = 8;
constexpr int kAdamVector = 4;  // elements per thread and grid-stride iteration

struct AdamParams {
  float* param[kMaxAdamGroups];
  const float* grad[kMaxAdamGroups];
  float* exp_avg[kMaxAdamGroups];
  float* exp_avg_sq[kMaxAdamGroups];
  float* step[kMaxAdamGroups];   // [] each
  int64_t end[kMaxAdamGroups];   // fours of elements of groups 0..g together (a group's last four may be partial)
  int64_t numel[kMaxAdamGroups];  // elements of group g
  bool aligned[kMaxAdamGroups];   // group g's param, grad and moments all 16-byte aligned
  int64_t row_width[kMaxAdamGroups];  // elements per splat row; 0: not masked by `visible`
  float beta1[kMaxAdamGroups];
  float beta2[kMaxAdamGroups];
  float eps[kMaxAdamGroups];
  int groups;
  const float* lrs;            // [groups]
  const bool* visible;         // [N] or nullptr
  const bool* skip;            // [] or nullptr
  unsigned int* blocks_done;   // [1], zero between launches
};

cudaError_t launch_adam(const AdamParams& p, cudaStream_t stream);

}  // namespace bytesplat

#ifndef __CUDACC__
#include "common.h"

namespace bytesplat {

// One Adam step of every group, in place. params/grads/exp_avgs/exp_avg_sqs: float32 on one device, one tensor
// per group; steps: [] float32; lrs: [groups] float32; betas/eps per group; visible: [N] bool (rows of groups
// whose first dimension is N); skip: [] bool, true leaves everything as it is; blocks_done: [1] int32 zeros,
// kept between calls.
void adam_step(const std::vector<at::Tensor>& params, const std::vector<at::Tensor>& grads,
               const std::vector<at::Tensor>& exp_avgs, const std::vector<at::Tensor>& exp_avg_sqs,
               const std::vector<at::Tensor>& steps, const at::Tensor& lrs, const std::vector<double>& beta1,
               const std::vector<double>& beta2, const std::vector<double>& eps,
               const c10::optional<at::Tensor>& visible, const c10::optional<at::Tensor>& skip,
               const at::Tensor& blocks_done);

}  // namespace bytesplat
#endif
