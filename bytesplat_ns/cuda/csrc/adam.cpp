// Host side of the one-launch Adam: checks, the pointer table, the launch on the current stream.
#include "adam.h"

namespace bytesplat {

void adam_step(const std::vector<at::Tensor>& params, const std::vector<at::Tensor>& grads,
               const std::vector<at::Tensor>& exp_avgs, const std::vector<at::Tensor>& exp_avg_sqs,
               const std::vector<at::Tensor>& steps, const at::Tensor& lrs, const std::vector<double>& beta1,
               const std::vector<double>& beta2, const std::vector<double>& eps,
               const c10::optional<at::Tensor>& visible, const c10::optional<at::Tensor>& skip,
               const at::Tensor& blocks_done) {
  const size_t groups = params.size();
  BYTESPLAT_CHECK(groups >= 1 && groups <= static_cast<size_t>(kMaxAdamGroups), "between 1 and ", kMaxAdamGroups,
              " parameter groups, got ", groups);
  for (size_t n : {grads.size(), exp_avgs.size(), exp_avg_sqs.size(), steps.size(), beta1.size(), beta2.size(),
                   eps.size()}) {
    BYTESPLAT_CHECK(n == groups, "one gradient, moment pair, step, beta pair and eps per parameter group");
  }
  BYTESPLAT_CHECK_INPUT(lrs, at::kFloat);
  check_shape(lrs, {static_cast<int64_t>(groups)}, "lrs");
  BYTESPLAT_CHECK_INPUT(blocks_done, at::kInt);
  check_shape(blocks_done, {1}, "blocks_done");
  const c10::cuda::CUDAGuard guard(lrs.device());
  int64_t rows = -1;
  if (visible.has_value()) {
    BYTESPLAT_CHECK_INPUT(visible.value(), at::kBool);
    BYTESPLAT_CHECK(visible->dim() == 1, "visible must be [N]");
    rows = visible->size(0);
  }
  if (skip.has_value()) {
    BYTESPLAT_CHECK_INPUT(skip.value(), at::kBool);
    BYTESPLAT_CHECK(skip->numel() == 1 && skip->device() == lrs.device(), "skip must be one bool on ", lrs.device());
  }
  AdamParams p{};
  int64_t total = 0;
  for (size_t g = 0; g < groups; ++g) {
    p.aligned[g] = true;
    for (const at::Tensor* t : {&params[g], &grads[g], &exp_avgs[g], &exp_avg_sqs[g]}) {
      BYTESPLAT_CHECK_INPUT(*t, at::kFloat);
      BYTESPLAT_CHECK(t->sizes() == params[g].sizes(), "group ", g, ": gradient and moments must match the parameter's ",
                  "shape ", params[g].sizes(), ", got ", t->sizes());
      BYTESPLAT_CHECK(t->device() == lrs.device(), "every tensor must be on ", lrs.device());
      p.aligned[g] = p.aligned[g] && reinterpret_cast<uintptr_t>(t->data_ptr()) % 16 == 0;
    }
    BYTESPLAT_CHECK_INPUT(steps[g], at::kFloat);
    BYTESPLAT_CHECK(steps[g].numel() == 1, "group ", g, ": the step must be a one-element tensor");
    p.param[g] = params[g].data_ptr<float>();
    p.grad[g] = grads[g].data_ptr<float>();
    p.exp_avg[g] = exp_avgs[g].data_ptr<float>();
    p.exp_avg_sq[g] = exp_avg_sqs[g].data_ptr<float>();
    p.step[g] = steps[g].data_ptr<float>();
    total += (params[g].numel() + kAdamVector - 1) / kAdamVector;
    p.end[g] = total;
    p.numel[g] = params[g].numel();
    const bool splat_rows = rows > 0 && params[g].dim() >= 1 && params[g].size(0) == rows;
    p.row_width[g] = splat_rows ? params[g].numel() / rows : 0;
    p.beta1[g] = static_cast<float>(beta1[g]);
    p.beta2[g] = static_cast<float>(beta2[g]);
    p.eps[g] = static_cast<float>(eps[g]);
  }
  p.groups = static_cast<int>(groups);
  p.lrs = lrs.data_ptr<float>();
  p.visible = visible.has_value() ? visible->data_ptr<bool>() : nullptr;
  p.skip = skip.has_value() ? skip->data_ptr<bool>() : nullptr;
  p.blocks_done = reinterpret_cast<unsigned int*>(blocks_done.data_ptr<int32_t>());
  BYTESPLAT_CHECK_CUDA_STATUS(launch_adam(p, c10::cuda::getCurrentCUDAStream().stream()));
}

}  // namespace bytesplat
