"""The SH colour kernels (csrc/sh.h) against render/sh.py's reference in float64: colours and the gradients of both
coefficient parts and the directions, on fresh random splats, every degree, with outputs poisoned so an unwritten
element fails; and a CUDA graph records them (GPU; skipped on the CPU)."""

from __future__ import annotations

import pytest
import torch

from bytesplat_ns.render.sh import MAX_DEGREE, sh_to_rgb

gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="the SH kernels need a CUDA GPU")
ABS_TOL = 1e-5
GRAD_RTOL = 1e-4


def _inputs(n: int, k: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """coeffs [n, k, 3] (large enough that some colours clamp at 0), dirs [n, 3] of many lengths, v_rgb [n, 3]."""
    g = torch.Generator().manual_seed(seed)
    coeffs = torch.randn(n, k, 3, generator=g) * 0.6
    dirs = torch.randn(n, 3, generator=g) * torch.rand(n, 1, generator=g).mul(20).add(0.05)
    v_rgb = torch.randn(n, 3, generator=g)
    return coeffs.cuda(), dirs.cuda(), v_rgb.cuda()


@gpu
@pytest.mark.parametrize("degree", range(MAX_DEGREE + 1))
@pytest.mark.parametrize("n", [1, 257, 40_000])
@pytest.mark.parametrize("all_coeffs", [True, False], ids=["K=16", "K=degree's"])
def test_colours_and_gradients_match_the_reference(degree, n, all_coeffs):
    """K = 16: the model's coefficients while its degree ramps up; else only the degree's (rows of 3, 12, 27 and
    48 floats: odd and even row lengths through the kernels' shared memory)."""
    from bytesplat_ns.cuda import ops
    from tests.fused_cases import assert_grad_close

    k = (MAX_DEGREE + 1) ** 2 if all_coeffs else (degree + 1) ** 2
    coeffs, dirs, v_rgb = _inputs(n, k, seed=degree * 1000 + n + k)
    ref_coeffs, ref_dirs = coeffs.double().requires_grad_(), dirs.double().requires_grad_()
    ref = sh_to_rgb(degree, ref_coeffs, ref_dirs)
    ref.backward(v_rgb.double())
    assert (ref == 0).any() or n < 40_000  # some colours clamp: the gradient's mask is tested

    dc, rest = coeffs[:, 0].clone().requires_grad_(), coeffs[:, 1:].clone().requires_grad_()  # as the model keeps them
    dirs.requires_grad_()
    rgb = ops.sh_colors(degree, dc, rest, dirs, poison=True)
    rgb.backward(v_rgb)
    grads = (dc.grad, rest.grad, dirs.grad)
    assert torch.isfinite(rgb).all() and all(torch.isfinite(g).all() for g in grads)
    assert float((rgb.detach().double() - ref.detach()).abs().max()) < ABS_TOL
    assert_grad_close(dc.grad, ref_coeffs.grad[:, 0], GRAD_RTOL, "dL/ddc")
    if k > 1:
        assert_grad_close(rest.grad, ref_coeffs.grad[:, 1:], GRAD_RTOL, "dL/drest")
    if degree == 0:  # a constant colour: the reference has no gradient w.r.t. dirs at all
        assert ref_dirs.grad is None and not dirs.grad.any()
    else:
        assert_grad_close(dirs.grad, ref_dirs.grad, GRAD_RTOL, "dL/ddirs")
    assert not rest.grad[:, degree * (degree + 2) :].any()  # bases past the degree take no gradient


@gpu
def test_more_than_sixteen_coefficients_are_refused():
    from bytesplat_ns.cuda import ops

    coeffs, dirs, _ = _inputs(10, 17, seed=3)
    with pytest.raises(RuntimeError, match="at most 16 coefficients"):
        ops.sh_colors(3, coeffs[:, 0].contiguous(), coeffs[:, 1:].contiguous(), dirs)


@gpu
def test_a_cuda_graph_records_the_kernels():
    """Replayed on new inputs, the recorded forward and backward give what an eager call gives."""
    from bytesplat_ns.cuda import ops

    def parts(coeffs, dirs, v_rgb):  # (dc, rest, dirs, v_rgb)
        return coeffs[:, 0].contiguous(), coeffs[:, 1:].contiguous(), dirs, v_rgb

    static = parts(*_inputs(1000, 16, seed=1))
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream):
        graph.capture_begin()
        leaves = [t.requires_grad_() for t in static[:3]]
        rgb = ops.sh_colors(3, *leaves)
        recorded = torch.autograd.grad(rgb, leaves, static[3])
        graph.capture_end()
    torch.cuda.current_stream().wait_stream(stream)
    fresh = parts(*_inputs(1000, 16, seed=2))
    with torch.no_grad():
        for s, f in zip(static, fresh):
            s.copy_(f)
    graph.replay()
    leaves = [t.clone().requires_grad_() for t in fresh[:3]]
    want = ops.sh_colors(3, *leaves)
    wanted = torch.autograd.grad(want, leaves, fresh[3])
    assert torch.equal(rgb, want) and all(torch.equal(a, b) for a, b in zip(recorded, wanted))


@gpu
@pytest.mark.parametrize("degree", [0, 3])
def test_culled_splats_are_skipped(degree):
    """Given screen radii, splats of radius 0 are not read (NaN coefficients and directions there stay out of every
    output) and get colour 0 and zero gradients; the others match the reference, as without radii."""
    from bytesplat_ns.cuda import ops
    from tests.fused_cases import assert_grad_close

    n, k = 1000, 16
    coeffs, dirs, v_rgb = _inputs(n, k, seed=7 + degree)
    radii = (torch.rand(n, generator=torch.Generator().manual_seed(degree)) < 0.7).int().mul(4).cuda()  # 30% culled
    culled = radii == 0
    ref_coeffs, ref_dirs = coeffs.double().requires_grad_(), dirs.double().requires_grad_()
    ref = sh_to_rgb(degree, ref_coeffs, ref_dirs)
    ref.backward(v_rgb.double())
    coeffs[culled], dirs[culled] = float("nan"), float("nan")  # never read
    dc, rest = coeffs[:, 0].clone().requires_grad_(), coeffs[:, 1:].clone().requires_grad_()
    dirs.requires_grad_()
    rgb = ops.sh_colors(degree, dc, rest, dirs, poison=True, radii=radii)
    rgb.backward(v_rgb)  # non-zero on culled rows too: they must still take no gradient
    assert not rgb[culled].any() and not dc.grad[culled].any() and not rest.grad[culled].any()
    assert not dirs.grad[culled].any()
    kept = ~culled
    assert float((rgb[kept].detach().double() - ref[kept].detach()).abs().max()) < ABS_TOL
    assert_grad_close(dc.grad[kept], ref_coeffs.grad[kept, 0], GRAD_RTOL, "dL/ddc")
    assert_grad_close(rest.grad[kept], ref_coeffs.grad[kept, 1:], GRAD_RTOL, "dL/drest")
    if degree > 0:
        assert_grad_close(dirs.grad[kept], ref_dirs.grad[kept], GRAD_RTOL, "dL/ddirs")
