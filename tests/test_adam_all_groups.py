"""The one-launch Adam (adam_all_groups.py, cuda/csrc/adam.h) against torch's fused Adam, group by group.

GPU: six groups shaped as the splat parameters (one of them large enough for the grid-stride loop), fresh random
gradients each step, learning rates changed between steps; the parameters, both moments and the step counts
within float rounding of torch's; a group without a gradient skipped as torch skips it; one kernel launch per
step; the launch recorded in a CUDA graph and replayed with new learning rates; the visibility-masked update
against a float64 reference; a step the non-finite guard flags changes nothing. CPU: which configurations fall
back to nerfstudio's per-group step, and why.
"""

from __future__ import annotations

import pytest
import torch
from nerfstudio.engine.optimizers import Optimizers

from bytesplat_method_configs import splatfacto_optimizers
from bytesplat_ns.adam_all_groups import AdamAllGroups, ineligible

gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="the one-launch Adam kernel needs a CUDA GPU")
SPLAT_GROUPS = ("means", "features_dc", "features_rest", "opacities", "scales", "quats")


def _optimizers(num_splats: int, device: str, seed: int, unaligned: bool = False, **options) -> Optimizers:
    """nerfstudio's Optimizers over random splat parameters, with bytesplat's Adam settings per group.
    `unaligned`: each parameter starts one float into its storage (not 16-byte aligned)."""
    gen = torch.Generator().manual_seed(seed)
    shapes = {"means": (3,), "features_dc": (3,), "features_rest": (15, 3), "opacities": (1,), "scales": (3,),
              "quats": (4,)}  # fmt: skip

    def make(shape: tuple) -> torch.Tensor:
        values = torch.randn(num_splats, *shape, generator=gen).to(device)
        if not unaligned:
            return values
        storage = torch.empty(values.numel() + 1, device=device)
        storage[1:] = values.reshape(-1)
        return storage[1:].view(values.shape)

    params = {name: [torch.nn.Parameter(make(shapes[name]))] for name in SPLAT_GROUPS}
    config = {name: splatfacto_optimizers()[name] for name in SPLAT_GROUPS}
    for name, value in options.items():
        for group in config.values():
            setattr(group["optimizer"], name, value)
    return Optimizers(config, params)


def _param(optimizers: Optimizers, name: str) -> torch.Tensor:
    return optimizers.optimizers[name].param_groups[0]["params"][0]


def _set_grads(optimizers: Optimizers, gen: torch.Generator, skip: str | None = None) -> None:
    for name in SPLAT_GROUPS:
        param = _param(optimizers, name)
        grad = torch.randn(param.shape, generator=gen) * (0.1 if name == "means" else 1.0)
        grad[torch.rand(param.shape[0], generator=gen) < 0.3] = 0.0  # rows no pixel touched
        param.grad = None if name == skip else grad.to(param.device)


def _lrs_step(optimizers: Optimizers, step: int) -> None:
    for index, opt in enumerate(optimizers.optimizers.values()):
        opt.param_groups[0]["lr"] = 1e-3 * (index + 1) * 0.9**step


def _assert_same_state(ours: Optimizers, theirs: Optimizers) -> None:
    for name in SPLAT_GROUPS:
        mine, ref = _param(ours, name), _param(theirs, name)
        torch.testing.assert_close(mine.data, ref.data, rtol=1e-5, atol=1e-6, msg=name)
        a, b = ours.optimizers[name].state[mine], theirs.optimizers[name].state[ref]
        for key in ("exp_avg", "exp_avg_sq"):  # norm-wise: moments that nearly cancel differ in their last bits
            error = float((a[key] - b[key]).norm() / b[key].norm().clamp_min(1e-30))
            assert error <= 1e-6, f"{name} {key}: relative error {error:.2e}"
        assert float(a["step"]) == float(b["step"]), name
        assert a["step"].device == mine.device and a["step"].dtype == torch.float32


@gpu
@pytest.mark.parametrize("num_splats", [1, 777, 20_000])
@pytest.mark.parametrize("unaligned", [False, True], ids=["aligned", "unaligned"])
def test_one_launch_matches_torch_fused_adam_per_group(num_splats, unaligned):
    """Aligned: four elements per 16-byte access, a group's last four partial at 777 splats; unaligned: the
    parameters one float into their storage, stepped one element at a time."""
    ours = _optimizers(num_splats, "cuda", seed=num_splats, unaligned=unaligned)
    theirs = _optimizers(num_splats, "cuda", seed=num_splats, unaligned=unaligned)
    adam = AdamAllGroups(ours, "cuda")
    gen_a, gen_b = torch.Generator().manual_seed(1), torch.Generator().manual_seed(1)
    for step in range(6):
        skip = "scales" if step == 2 else None  # a group without a gradient takes no step, as in torch
        for opts, gen in ((ours, gen_a), (theirs, gen_b)):
            _lrs_step(opts, step)
            _set_grads(opts, gen, skip)
        adam.load_learning_rates()
        adam.step()
        theirs.optimizer_step_all()
    torch.cuda.synchronize()
    _assert_same_state(ours, theirs)
    assert float(ours.optimizers["scales"].state[_param(ours, "scales")]["step"]) == 5
    assert float(ours.optimizers["means"].state[_param(ours, "means")]["step"]) == 6


@gpu
def test_a_step_is_one_kernel_launch():
    optimizers = _optimizers(5000, "cuda", seed=3)
    adam = AdamAllGroups(optimizers, "cuda")
    gen = torch.Generator().manual_seed(0)
    _set_grads(optimizers, gen)
    adam.load_learning_rates()
    adam.step()  # creates the state
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        adam.step()
        torch.cuda.synchronize()
    kernels = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    assert len(kernels) == 1 and "adam" in kernels[0], kernels


@gpu
def test_recorded_in_a_cuda_graph_and_replayed_with_new_learning_rates():
    ours, theirs = _optimizers(3000, "cuda", seed=5), _optimizers(3000, "cuda", seed=5)
    adam = AdamAllGroups(ours, "cuda")
    gen_a, gen_b = torch.Generator().manual_seed(2), torch.Generator().manual_seed(2)
    for opts, gen in ((ours, gen_a), (theirs, gen_b)):  # a first step makes the state (not inside a recording)
        _lrs_step(opts, 0)
        _set_grads(opts, gen)
    adam.load_learning_rates()
    adam.step()
    theirs.optimizer_step_all()
    grads = [_param(ours, name).grad for name in SPLAT_GROUPS]  # the graph's static gradients
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        graph.capture_begin()
        adam.step()
        graph.capture_end()
    torch.cuda.current_stream().wait_stream(stream)
    for step in range(1, 5):
        for opts, gen in ((ours, gen_a), (theirs, gen_b)):
            _lrs_step(opts, step)
            _set_grads(opts, gen)
        for static, name in zip(grads, SPLAT_GROUPS):
            static.copy_(_param(ours, name).grad)
        adam.load_learning_rates()
        graph.replay()
        theirs.optimizer_step_all()
    torch.cuda.synchronize()
    _assert_same_state(ours, theirs)


def _masked_reference(param, grad, m, v, step, lr, visible, betas=(0.9, 0.999), eps=1e-15):
    """Adam in float64 on the visible rows; the others untouched."""
    b1, b2 = betas
    p64, g64, m64, v64 = (t.double() for t in (param, grad, m, v))
    m_new = b1 * m64 + (1 - b1) * g64
    v_new = b2 * v64 + (1 - b2) * g64 * g64
    t = step + 1
    p_new = p64 - lr / (1 - b1**t) * m_new / (v_new.sqrt() / (1 - b2**t) ** 0.5 + eps)
    rows = visible.reshape(-1, *[1] * (param.dim() - 1))
    return [torch.where(rows, new, old) for new, old in ((p_new, p64), (m_new, m64), (v_new, v64))]


@gpu
def test_visible_only_updates_the_rows_of_visible_splats():
    num_splats = 4000
    optimizers = _optimizers(num_splats, "cuda", seed=7)
    adam = AdamAllGroups(optimizers, "cuda", visible_only=True)
    gen = torch.Generator().manual_seed(4)
    for step in range(3):
        _lrs_step(optimizers, step)
        _set_grads(optimizers, gen)
        radii = torch.randint(0, 3, (1, num_splats), generator=gen, dtype=torch.int32).cuda()  # 0: out of view
        visible = (radii > 0)[0]
        expected = {}
        for name in SPLAT_GROUPS:
            param = _param(optimizers, name)
            state = optimizers.optimizers[name].state.get(param) or {}
            zeros = torch.zeros_like(param)
            m, v = state.get("exp_avg", zeros), state.get("exp_avg_sq", zeros)
            lr = optimizers.optimizers[name].param_groups[0]["lr"]
            expected[name] = _masked_reference(param.data, param.grad, m, v, step, lr, visible)
        adam.load_learning_rates()
        adam.step(radii)
        torch.cuda.synchronize()
        for name in SPLAT_GROUPS:
            param = _param(optimizers, name)
            state = optimizers.optimizers[name].state[param]
            for got, want, what in zip((param.data, state["exp_avg"], state["exp_avg_sq"]), expected[name],
                                       ("param", "exp_avg", "exp_avg_sq")):  # fmt: skip
                torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-7, msg=f"{name} {what}")
            assert float(state["step"]) == step + 1


@gpu
def test_a_flagged_step_changes_nothing_and_an_unflagged_one_steps():
    """`skip` (the non-finite guard's flag, on the device): True leaves parameters, moments and step counts as
    they are, even with non-finite gradients; False steps as torch does."""
    ours, theirs = _optimizers(2000, "cuda", seed=9), _optimizers(2000, "cuda", seed=9)
    adam = AdamAllGroups(ours, "cuda")
    gen_a, gen_b = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
    for opts, gen in ((ours, gen_a), (theirs, gen_b)):
        _lrs_step(opts, 0)
        _set_grads(opts, gen)
    adam.load_learning_rates()
    adam.step(skip=torch.zeros((), dtype=torch.bool, device="cuda"))
    theirs.optimizer_step_all()
    _assert_same_state(ours, theirs)

    _lrs_step(ours, 1)
    _set_grads(ours, gen_a)
    _param(ours, "scales").grad[5, 1] = float("nan")
    adam.load_learning_rates()
    adam.step(skip=torch.ones((), dtype=torch.bool, device="cuda"))
    torch.cuda.synchronize()
    _assert_same_state(ours, theirs)  # as after the first step: nothing moved, the steps still 1
    assert int(adam.blocks_done) == 0  # the counter stays armed for the next launch


def test_the_cpu_and_other_optimizers_take_the_per_group_step():
    assert ineligible(_optimizers(10, "cpu", seed=0), "cpu", mixed_precision=False) == "training on the CPU"
    assert ineligible(_optimizers(10, "cpu", seed=0), "cuda:0", mixed_precision=True).startswith("mixed precision")
    clipped = _optimizers(10, "cpu", seed=0, max_norm=1.0)
    assert ineligible(clipped, "cuda:0", mixed_precision=False) == "gradient clipping"
    amsgrad = _optimizers(10, "cpu", seed=0)
    amsgrad.optimizers["quats"].param_groups[0]["amsgrad"] = True
    assert ineligible(amsgrad, "cuda:0", mixed_precision=False).startswith("an optimizer other than Adam")
    assert ineligible(_optimizers(10, "cpu", seed=0), "cuda:0", mixed_precision=False) is None


def test_the_trainer_steps_per_group_on_the_cpu_and_says_why(tmp_path):
    from tests.trainer_setup import make_trainer

    trainer = make_trainer(tmp_path, steps=1)
    assert trainer.adam is None and trainer.adam_off == "training on the CPU"
