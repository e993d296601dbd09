"""The pure-PyTorch renderer (backend "torch") against values worked out by hand.

Each expected value is computed here, independently of the renderer's code, with plain numpy for
the specific configuration under test: the EWA footprint of an isotropic splat, gsplat's alpha
rules, front-to-back compositing with its early stop, SH bases and depth. The last tests run
`torch.autograd.gradcheck` through the whole renderer in float64. CPU only; float64 throughout.

gsplat 1.4.0 rules mirrored here (classic mode, pinhole camera):
  * 2D covariance: J Sigma J^T + eps2d I, J the perspective Jacobian at the camera-space centre.
  * radius = ceil(3 sqrt(v1)), v1 = b + sqrt(max(0.01, b^2 - det)), b = half the trace.
  * culled (radius 0): depth outside [near, far], det <= 0, or the radius square entirely off screen.
  * a splat is evaluated on every pixel of every 16x16 tile its radius square overlaps.
  * pixel centres at +0.5; alpha = min(0.999, opacity exp(-sigma)); skipped when alpha < 1/255;
    a pixel stops before the splat that would take its transmittance to 1e-4 or below.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch

from bytesplat_ns.render import RasterizeOptions, rasterize
from tests.scenes import (
    SceneSpec,
    camera,
    camera_to_world,
    colors_grad,
    in_two_parts,
    make_splats,
    random_scene,
    rotation,
    tilted_camera,
    viewmat,
)

# gsplat's constants, restated rather than imported from the code under test.
EPS2D = 0.3
ALPHA_MIN = 1.0 / 255.0
ALPHA_MAX = 0.999
T_MIN = 1e-4
TILE = 16
SH_C0 = 0.28209479177387814
SH_C1 = 0.4886025119029199

# Tolerances.
EXACT_ATOL = 1e-12
"""float64 renderer vs float64 hand computation: only rounding separates them."""
THRESHOLD_MARGIN = 1e-9
"""Hand-made scenes keep every alpha and transmittance at least this (relatively) clear of
gsplat's cut-offs, so rounding cannot flip a decision between the test and the renderer."""
GRAD_ZERO_ATOL = 0.0
"""Culled splats get exactly zero gradient."""
ABSGRAD_SLACK = 1e-12
GRADCHECK_EPS = 1e-6
GRADCHECK_ATOL = 1e-5
GRADCHECK_RTOL = 1e-3

F64 = torch.float64
BACKGROUND = (0.2, 0.3, 0.5)


# ----------------------------------------------------------------------------------------------
# Hand computation (numpy, float64)
# ----------------------------------------------------------------------------------------------


def footprint(mean_cam, scale: float, focal: float) -> np.ndarray:
    """2D covariance (pixels^2) of an isotropic splat of std `scale` centred at camera-space `mean_cam`
    (inside the field of view): scale^2 J J^T + eps2d I."""
    x, y, z = mean_cam
    jac = np.array([[focal / z, 0.0, -focal * x / z**2], [0.0, focal / z, -focal * y / z**2]])
    return scale**2 * jac @ jac.T + EPS2D * np.eye(2)


def gsplat_radius(cov2d: np.ndarray) -> int:
    b = 0.5 * (cov2d[0, 0] + cov2d[1, 1])
    det = np.linalg.det(cov2d)
    return math.ceil(3.0 * math.sqrt(b + math.sqrt(max(0.01, b * b - det))))


def project_point(mean_cam, focal: float, cx: float, cy: float) -> np.ndarray:
    x, y, z = mean_cam
    return np.array([focal * x / z + cx, focal * y / z + cy])


def pixel_centres(width: int, height: int) -> tuple:
    ys, xs = np.mgrid[0:height, 0:width].astype(np.float64)
    return xs + 0.5, ys + 0.5


def raw_alpha(mean2d, cov2d, opacity: float, width: int, height: int) -> np.ndarray:
    """[H, W] min(0.999, opacity exp(-sigma)) before the 1/255 cut."""
    xs, ys = pixel_centres(width, height)
    dx, dy = xs - mean2d[0], ys - mean2d[1]
    inv = np.linalg.inv(cov2d)
    sigma = 0.5 * (inv[0, 0] * dx * dx + 2.0 * inv[0, 1] * dx * dy + inv[1, 1] * dy * dy)
    return np.minimum(ALPHA_MAX, opacity * np.exp(-sigma))


def tile_mask(mean2d, radius: int, width: int, height: int) -> np.ndarray:
    """[H, W] True on pixels of the tiles that the splat's radius square overlaps."""
    tiles_x, tiles_y = math.ceil(width / TILE), math.ceil(height / TILE)
    x0 = min(max(math.floor((mean2d[0] - radius) / TILE), 0), tiles_x)
    x1 = min(max(math.ceil((mean2d[0] + radius) / TILE), 0), tiles_x)
    y0 = min(max(math.floor((mean2d[1] - radius) / TILE), 0), tiles_y)
    y1 = min(max(math.ceil((mean2d[1] + radius) / TILE), 0), tiles_y)
    xs, ys = pixel_centres(width, height)
    tx, ty = np.floor(xs / TILE), np.floor(ys / TILE)
    return (tx >= x0) & (tx < x1) & (ty >= y0) & (ty < y1)


def splat_alpha(mean_cam, scale, opacity, focal, width, height, cx=None, cy=None) -> np.ndarray:
    """[H, W] alpha that one isotropic splat offers each pixel under gsplat's rules (0 where skipped)."""
    cx = 0.5 * width if cx is None else cx
    cy = 0.5 * height if cy is None else cy
    cov = footprint(mean_cam, scale, focal)
    mean2d = project_point(mean_cam, focal, cx, cy)
    a = raw_alpha(mean2d, cov, opacity, width, height)
    assert np.all(np.abs(a - ALPHA_MIN) > THRESHOLD_MARGIN * ALPHA_MIN), "scene too close to the 1/255 cut"
    a = np.where(a >= ALPHA_MIN, a, 0.0)
    return np.where(tile_mask(mean2d, gsplat_radius(cov), width, height), a, 0.0)


def composite(layers, background=None) -> tuple:
    """Front-to-back compositing with gsplat's early stop.

    layers: (alpha [H, W], features [D]) nearest first. Returns (features [H, W, D] with the
    background added as T * bg when given, alpha [H, W], splats used per pixel [H, W]).
    """
    h, w = layers[0][0].shape
    d = len(layers[0][1])
    transmit = np.ones((h, w))
    out = np.zeros((h, w, d))
    used = np.zeros((h, w), dtype=int)
    done = np.zeros((h, w), dtype=bool)
    for alpha, feat in layers:
        active = ~done & (alpha > 0)
        next_t = transmit * (1.0 - alpha)
        near_stop = active & (np.abs(next_t - T_MIN) <= THRESHOLD_MARGIN * T_MIN)
        assert not near_stop.any(), "scene too close to the transmittance cut"
        stop = active & (next_t <= T_MIN)
        keep = active & ~stop
        done |= stop
        out += np.where(keep, alpha * transmit, 0.0)[..., None] * np.asarray(feat, dtype=np.float64)
        transmit = np.where(keep, next_t, transmit)
        used += keep
    if background is not None:
        out = out + transmit[..., None] * np.asarray(background, dtype=np.float64)
    return out, 1.0 - transmit, used


# ----------------------------------------------------------------------------------------------
# Helpers around the renderer
# ----------------------------------------------------------------------------------------------


def iso_splats(points_cam, scales, opacities, colors, cam, requires_grad=False):
    """Isotropic splats given in camera space (converted to world space for `cam`)."""
    pts = torch.tensor(points_cam, dtype=F64).reshape(-1, 3)
    n = pts.shape[0]
    return make_splats(
        means=camera_to_world(pts, cam),
        scales=torch.tensor(scales, dtype=F64).reshape(n, 1).expand(n, 3),
        opacities=torch.tensor(opacities, dtype=F64).reshape(n),
        colors=torch.tensor(colors, dtype=F64),
        requires_grad=requires_grad,
    )


def options(background=BACKGROUND, **kwargs) -> RasterizeOptions:
    bg = None if background is None else torch.tensor(background, dtype=F64)
    kwargs.setdefault("sh_degree", None)
    return RasterizeOptions(background=bg, backend="torch", **kwargs)


def as_np(t: torch.Tensor) -> np.ndarray:
    return t.detach().cpu().numpy()


# ----------------------------------------------------------------------------------------------
# One splat
# ----------------------------------------------------------------------------------------------


def test_single_splat_matches_ewa_formula():
    """A centred isotropic splat: pixel values are opacity exp(-d^T Sigma2d^-1 d / 2) over the
    background, with Sigma2d = (f s / z)^2 I + 0.3 I; centre, radius and the whole image by hand."""
    torch.manual_seed(0)
    width = height = 33  # principal point (16.5, 16.5): the centre of pixel (16, 16)
    focal, z, s, opacity = 50.0, 4.0, 0.208, 0.8
    color = np.array([0.9, 0.4, 0.1])
    cam = camera(width, height, focal)
    splats = iso_splats([0.0, 0.0, z], [s], [opacity], [color.tolist()], cam)
    out = rasterize(splats, cam, options(render_depth=True))

    var = (focal * s / z) ** 2 + EPS2D  # Sigma2d = var * I
    # gsplat pads the eigenvalue: v1 = b + sqrt(max(0.01, b^2 - det)) = var + 0.1 for a round splat.
    radius = math.ceil(3.0 * math.sqrt(var + 0.1))
    assert radius == 9 and math.ceil(3.0 * math.sqrt(var)) == 8  # the padding matters for this scale
    assert out.radii.shape == (1, 1) and out.radii.dtype == torch.int32
    assert int(out.radii[0, 0]) == radius
    torch.testing.assert_close(out.means2d, torch.tensor([[[16.5, 16.5]]], dtype=F64), atol=EXACT_ATOL, rtol=0)

    bg = np.array(BACKGROUND)
    for dx, dy in [(0, 0), (3, 0), (0, -2), (2, 3), (-4, 1), (5, 2)]:
        a = opacity * math.exp(-0.5 * (dx * dx + dy * dy) / var)
        assert a >= ALPHA_MIN
        row, col = 16 + dy, 16 + dx
        np.testing.assert_allclose(as_np(out.alpha[row, col, 0]), a, atol=EXACT_ATOL, rtol=0)
        np.testing.assert_allclose(as_np(out.rgb[row, col]), a * color + (1 - a) * bg, atol=EXACT_ATOL, rtol=0)
        np.testing.assert_allclose(as_np(out.depth[row, col, 0]), z, atol=EXACT_ATOL, rtol=0)

    # Far enough out, alpha falls under 1/255: the pixel is untouched, exactly background.
    a_far = opacity * math.exp(-0.5 * (7 * 7 + 7 * 7) / var)
    assert a_far < ALPHA_MIN
    assert float(out.alpha[16 + 7, 16 + 7, 0]) == 0.0
    np.testing.assert_array_equal(as_np(out.rgb[16 + 7, 16 + 7]), bg)

    expected_alpha = splat_alpha((0.0, 0.0, z), s, opacity, focal, width, height)
    expected_rgb, alpha, _ = composite([(expected_alpha, color)], bg)
    assert out.rgb.shape == (height, width, 3) and out.alpha.shape == (height, width, 1)
    np.testing.assert_allclose(as_np(out.alpha[..., 0]), alpha, atol=EXACT_ATOL, rtol=0)
    np.testing.assert_allclose(as_np(out.rgb), expected_rgb, atol=EXACT_ATOL, rtol=0)


def test_single_splat_off_axis_uses_full_jacobian():
    """Off-axis, the Jacobian's third column stretches the footprint: Sigma2d = s^2 J J^T + 0.3 I."""
    torch.manual_seed(1)
    width, height, focal = 48, 40, 40.0
    mean_cam, s, opacity = (0.9, -0.5, 3.0), 0.15, 0.7
    color = np.array([0.2, 0.8, 0.6])
    cam = camera(width, height, focal, view=viewmat(rotation((1.0, 2.0, 0.5), 0.6), (1.0, 2.0, -3.0)))
    out = rasterize(iso_splats(mean_cam, [s], [opacity], [color.tolist()], cam), cam, options())

    mean2d = project_point(mean_cam, focal, 0.5 * width, 0.5 * height)
    cov = footprint(mean_cam, s, focal)
    assert abs(cov[0, 1]) > 0.05  # genuinely anisotropic
    np.testing.assert_allclose(as_np(out.means2d[0, 0]), mean2d, atol=EXACT_ATOL, rtol=0)
    assert int(out.radii[0, 0]) == gsplat_radius(cov)
    expected_rgb, expected_alpha, _ = composite(
        [(splat_alpha(mean_cam, s, opacity, focal, width, height), color)], BACKGROUND
    )
    np.testing.assert_allclose(as_np(out.alpha[..., 0]), expected_alpha, atol=EXACT_ATOL, rtol=0)
    np.testing.assert_allclose(as_np(out.rgb), expected_rgb, atol=EXACT_ATOL, rtol=0)


# ----------------------------------------------------------------------------------------------
# Two splats: depth order
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("red_is_nearer", [True, False])
@pytest.mark.parametrize("red_listed_first", [True, False])
def test_two_splats_composite_nearer_first(red_is_nearer: bool, red_listed_first: bool):
    """colour = a1 c1 + (1 - a1) a2 c2 + (1 - a1)(1 - a2) bg with splat 1 the nearer, whatever the
    order of the input rows; swapping the depths swaps the roles."""
    torch.manual_seed(2)
    width = height = 33
    focal = 50.0
    red, blue = np.array([1.0, 0.1, 0.0]), np.array([0.0, 0.2, 1.0])
    o_red, o_blue = 0.6, 0.5
    z_near, z_far = 3.0, 5.0
    z_red, z_blue = (z_near, z_far) if red_is_nearer else (z_far, z_near)
    # Scale grows with depth so both footprints are the same size on screen wherever they sit.
    s_red, s_blue = 0.05 * z_red, 0.05 * z_blue
    rows = [((0.0, 0.0, z_red), s_red, o_red, red), ((0.0, 0.0, z_blue), s_blue, o_blue, blue)]
    if not red_listed_first:
        rows = rows[::-1]
    cam = camera(width, height, focal)
    points, scales, opacities, colors = zip(*rows)
    splats = iso_splats(points, scales, opacities, [c.tolist() for c in colors], cam)
    out = rasterize(splats, cam, options(render_depth=True))

    var = (focal * 0.05) ** 2 + EPS2D
    bg = np.array(BACKGROUND)
    for dx, dy in [(0, 0), (1, 2), (-3, 0)]:
        g = math.exp(-0.5 * (dx * dx + dy * dy) / var)
        (a1, c1, z1), (a2, c2, z2) = sorted([(o_red * g, red, z_red), (o_blue * g, blue, z_blue)], key=lambda t: t[2])
        expected = a1 * c1 + (1 - a1) * a2 * c2 + (1 - a1) * (1 - a2) * bg
        alpha = 1 - (1 - a1) * (1 - a2)
        depth = (a1 * z1 + (1 - a1) * a2 * z2) / alpha
        pix = (16 + dy, 16 + dx)
        np.testing.assert_allclose(as_np(out.rgb[pix]), expected, atol=EXACT_ATOL, rtol=0)
        np.testing.assert_allclose(as_np(out.alpha[pix]), [alpha], atol=EXACT_ATOL, rtol=0)
        np.testing.assert_allclose(as_np(out.depth[pix]), [depth], atol=EXACT_ATOL, rtol=0)

    layers = sorted(
        [(splat_alpha(r[0], r[1], r[2], focal, width, height), r[3], r[0][2]) for r in rows], key=lambda t: t[2]
    )
    expected_rgb, expected_alpha, _ = composite([(a, c) for a, c, _ in layers], bg)
    np.testing.assert_allclose(as_np(out.rgb), expected_rgb, atol=EXACT_ATOL, rtol=0)
    np.testing.assert_allclose(as_np(out.alpha[..., 0]), expected_alpha, atol=EXACT_ATOL, rtol=0)
    # At the centre the nearer splat's colour dominates.
    centre = as_np(out.rgb[16, 16])
    assert (centre[0] > centre[2]) == red_is_nearer


# ----------------------------------------------------------------------------------------------
# Culling
# ----------------------------------------------------------------------------------------------


def test_culled_by_depth_contribute_nothing_and_get_zero_gradients():
    """Behind the camera, nearer than the near plane, or beyond the far plane: radius 0, no effect on
    the image, finite outputs, and exactly zero (finite) gradients for every parameter."""
    torch.manual_seed(3)
    width, height, focal = 32, 24, 30.0
    cam = tilted_camera(width, height, focal)
    opts = options(sh_degree=1, render_depth=True, near_plane=0.01, far_plane=50.0)
    points = [
        (0.0, 0.0, 3.0),  # visible
        (0.0, 0.0, -2.0),  # behind the camera
        (0.1, 0.0, 0.005),  # in front, but nearer than near_plane
        (0.0, 0.0, 0.0),  # at the camera centre
        (0.0, 0.1, 80.0),  # beyond far_plane
    ]
    n = len(points)
    coeffs = 0.5 * torch.randn(n, 4, 3, dtype=F64)
    # Anisotropic and rotated, so that a zero quaternion gradient below is down to the culling.
    quats = torch.randn(n, 4, dtype=F64)
    scales = torch.tensor([0.4, 0.2, 0.1], dtype=F64).expand(n, 3)
    means = camera_to_world(torch.tensor(points, dtype=F64), cam)
    splats = make_splats(means, scales, torch.full((n,), 0.7, dtype=F64), coeffs, quats, requires_grad=True)
    out = rasterize(splats, cam, opts)
    assert out.radii.tolist() == [[int(out.radii[0, 0]), 0, 0, 0, 0]] and int(out.radii[0, 0]) > 0
    for t in (out.rgb, out.alpha, out.depth, out.means2d):
        assert torch.isfinite(t).all()

    first = make_splats(means[:1], scales[:1], torch.tensor([0.7], dtype=F64), coeffs[:1], quats[:1])
    alone = rasterize(first, cam, opts)
    torch.testing.assert_close(out.rgb, alone.rgb, atol=EXACT_ATOL, rtol=0)
    torch.testing.assert_close(out.alpha, alone.alpha, atol=EXACT_ATOL, rtol=0)
    torch.testing.assert_close(out.depth, alone.depth, atol=EXACT_ATOL, rtol=0)

    out.means2d.retain_grad()
    weights = torch.rand(height, width, 3, dtype=F64)
    ((out.rgb * weights).sum() + out.alpha.sum() + out.depth.sum()).backward()
    for name in ("means", "quats", "scales", "opacities", "colors"):
        grad = getattr(splats, name).grad
        assert grad is not None and torch.isfinite(grad).all(), name
        assert grad[0].abs().sum() > 0, f"visible splat has no {name} gradient"
        torch.testing.assert_close(grad[1:], torch.zeros_like(grad[1:]), atol=GRAD_ZERO_ATOL, rtol=0, msg=name)
    assert torch.isfinite(out.means2d.grad).all()
    assert (out.means2d.grad[0, 1:] == 0).all()
    assert (out.means2d.absgrad[0, 1:] == 0).all()


def test_off_screen_splat_is_culled():
    """A splat whose radius square misses the image: radius 0 and the image is the background.
    One whose centre is off screen but whose square reaches in is kept and drawn."""
    torch.manual_seed(4)
    width, height, focal = 40, 30, 40.0
    cam = camera(width, height, focal)
    bg = np.array(BACKGROUND)
    # Left of the image by 30 px, footprint ~1.5 px: radius ~ 5.
    z, s = 4.0, 0.15
    off = ((-30.0 - 20.0) * z / focal, 0.0, z)  # projects to x = -30
    out = rasterize(iso_splats([off], [s], [0.9], [[1.0, 0.0, 0.0]], cam), cam, options())
    assert out.radii.tolist() == [[0]]
    np.testing.assert_array_equal(as_np(out.rgb), np.broadcast_to(bg, (height, width, 3)))
    np.testing.assert_array_equal(as_np(out.alpha), np.zeros((height, width, 1)))

    # Centre 2 px left of the image, radius well over 2: kept; its right flank lights column 0.
    edge = ((-2.0 - 20.0) * z / focal, (3.3 - 15.0) * z / focal, z)
    cov = footprint(edge, s, focal)
    radius = gsplat_radius(cov)
    assert radius > 2
    out = rasterize(iso_splats([edge], [s], [0.9], [[1.0, 0.0, 0.0]], cam), cam, options())
    assert out.radii.tolist() == [[radius]]
    expected_rgb, _, _ = composite([(splat_alpha(edge, s, 0.9, focal, width, height), [1.0, 0.0, 0.0])], bg)
    assert (expected_rgb[:, 0, 0] > bg[0] + 0.01).any()
    np.testing.assert_allclose(as_np(out.rgb), expected_rgb, atol=EXACT_ATOL, rtol=0)


# ----------------------------------------------------------------------------------------------
# Extreme scales and the alpha cut-offs
# ----------------------------------------------------------------------------------------------


def test_tiny_splat_touches_only_pixels_above_the_alpha_cut():
    """A point-like splat is blurred to Sigma2d ~ 0.3 I: with opacity 0.9 exactly the 3x3 pixels
    around it reach alpha >= 1/255 (0.9, 0.9 e^{-1/0.6}, 0.9 e^{-2/0.6}); the next ring
    (0.9 e^{-4/0.6} ~ 0.0011) is skipped. An opacity below 1/255 touches nothing."""
    torch.manual_seed(5)
    width, height, focal = 32, 32, 50.0
    cx, cy = 8.5, 9.5  # the principal point is the centre of pixel (row 9, col 8)
    cam = camera(width, height, focal, principal=(cx, cy))
    z, s = 4.0, 1e-5
    mean_cam = (0.0, 0.0, z)  # on the optical axis: the footprint is exactly round
    out = rasterize(iso_splats([mean_cam], [s], [0.9], [[0.0, 1.0, 0.0]], cam), cam, options())
    assert int(out.radii[0, 0]) == math.ceil(3 * math.sqrt(EPS2D + 0.1)) == 2
    alpha = as_np(out.alpha[..., 0])
    touched = np.argwhere(alpha > 0)
    assert sorted(map(tuple, touched)) == [(r, c) for r in (8, 9, 10) for c in (7, 8, 9)]
    g = lambda d2: 0.9 * math.exp(-0.5 * d2 / (EPS2D + (focal * s / z) ** 2))  # noqa: E731
    np.testing.assert_allclose(alpha[9, 8], g(0), atol=EXACT_ATOL, rtol=0)
    np.testing.assert_allclose(alpha[9, 9], g(1), atol=EXACT_ATOL, rtol=0)
    np.testing.assert_allclose(alpha[10, 9], g(2), atol=EXACT_ATOL, rtol=0)
    assert g(4) < ALPHA_MIN
    expected_rgb, expected_alpha, _ = composite(
        [(splat_alpha(mean_cam, s, 0.9, focal, width, height, cx, cy), [0.0, 1.0, 0.0])], BACKGROUND
    )
    np.testing.assert_allclose(alpha, expected_alpha, atol=EXACT_ATOL, rtol=0)
    np.testing.assert_allclose(as_np(out.rgb), expected_rgb, atol=EXACT_ATOL, rtol=0)

    faint = rasterize(iso_splats([mean_cam], [s], [0.5 * ALPHA_MIN], [[0.0, 1.0, 0.0]], cam), cam, options())
    assert int(faint.radii[0, 0]) == 2  # projected and binned, but below the cut everywhere
    assert (faint.alpha == 0).all()


def test_huge_splat_covers_every_tile_and_clamps_alpha():
    """A splat ~25 px wide on a 64x48 image (4x3 tiles) reaches every pixel; near its centre
    opacity 1 * exp(-sigma) > 0.999, so alpha clamps to 0.999."""
    torch.manual_seed(6)
    width, height, focal = 64, 48, 50.0
    cam = camera(width, height, focal)
    z, s = 4.0, 2.0
    color = [0.3, 0.6, 0.9]
    out = rasterize(iso_splats([(0.0, 0.0, z)], [s], [1.0], [color], cam), cam, options())
    var = (focal * s / z) ** 2 + EPS2D
    assert int(out.radii[0, 0]) == math.ceil(3 * math.sqrt(var + 0.1)) == 76
    alpha = as_np(out.alpha[..., 0])
    assert (alpha > 0).all()
    assert alpha[23, 31] == pytest.approx(ALPHA_MAX, abs=EXACT_ATOL)  # |d|^2 = 0.5: exp(-sigma) > 0.999
    expected_rgb, expected_alpha, _ = composite(
        [(splat_alpha((0.0, 0.0, z), s, 1.0, focal, width, height), color)], BACKGROUND
    )
    np.testing.assert_allclose(alpha, expected_alpha, atol=EXACT_ATOL, rtol=0)
    np.testing.assert_allclose(as_np(out.rgb), expected_rgb, atol=EXACT_ATOL, rtol=0)


def test_opaque_stack_stops_before_transmittance_cut():
    """Three splats of opacity 0.999 stacked in depth. At the centre each offers alpha ~0.9984, so
    after the first T ~ 1.6e-3 and the second would take it to ~2.6e-6 <= 1e-4: gsplat stops BEFORE the
    second (the cut is exclusive) and the pixel keeps only the first: rgb = a c1 + (1 - a) bg.
    Further out, where alpha is smaller, two and then all three splats fit."""
    torch.manual_seed(7)
    width, height, focal = 64, 48, 50.0
    cam = camera(width, height, focal)
    depths = (3.0, 4.0, 5.0)
    colors = ([1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0])
    scales = [0.4 * d for d in depths]  # same 20 px footprint for all three
    points = [(0.0, 0.0, d) for d in depths]
    out = rasterize(iso_splats(points[::-1], scales[::-1], [0.999] * 3, colors[::-1], cam), cam, options())

    layers = [(splat_alpha(p, s, 0.999, focal, width, height), c) for p, s, c in zip(points, scales, colors)]
    expected_rgb, expected_alpha, used = composite(layers, BACKGROUND)
    assert {1, 2, 3} <= set(np.unique(used).tolist())  # every regime occurs somewhere in the image
    np.testing.assert_allclose(as_np(out.alpha[..., 0]), expected_alpha, atol=EXACT_ATOL, rtol=0)
    np.testing.assert_allclose(as_np(out.rgb), expected_rgb, atol=EXACT_ATOL, rtol=0)

    # The centre pixel by hand: d = (-0.5, -0.5) from the projected centre (32, 24).
    a = min(ALPHA_MAX, 0.999 * math.exp(-0.5 * 0.5 / ((focal * 0.4) ** 2 + EPS2D)))
    assert (1 - a) > T_MIN and (1 - a) ** 2 <= T_MIN
    assert used[23, 31] == 1
    np.testing.assert_allclose(as_np(out.alpha[23, 31]), [a], atol=EXACT_ATOL, rtol=0)
    np.testing.assert_allclose(
        as_np(out.rgb[23, 31]), a * np.array(colors[0]) + (1 - a) * np.array(BACKGROUND), atol=EXACT_ATOL, rtol=0
    )


# ----------------------------------------------------------------------------------------------
# Image sizes that are not a multiple of the tile size
# ----------------------------------------------------------------------------------------------


def test_image_size_not_multiple_of_tile():
    """37x23 (3x2 tiles, the last ones partial): output shapes and the right/bottom edge pixels."""
    torch.manual_seed(8)
    width, height, focal = 37, 23, 30.0
    cam = camera(width, height, focal)  # principal point (18.5, 11.5)
    z = 3.0
    targets = [(35.2, 21.7, 0.09), (36.5, 5.5, 0.12), (3.3, 22.5, 0.1), (38.5, 12.0, 0.2), (20.0, 11.0, 0.3)]
    depths = [z + 0.3 * i for i in range(len(targets))]
    points = [((u - 18.5) * d / focal, (v - 11.5) * d / focal, d) for (u, v, _), d in zip(targets, depths)]
    scales = [t[2] for t in targets]
    opacities = [0.8, 0.6, 0.9, 0.7, 0.4]
    colors = np.random.default_rng(8).uniform(0.0, 1.0, size=(len(points), 3))
    out = rasterize(iso_splats(points, scales, opacities, colors.tolist(), cam), cam, options(render_depth=True))
    assert out.rgb.shape == (height, width, 3)
    assert out.alpha.shape == (height, width, 1)
    assert out.depth.shape == (height, width, 1)
    assert out.width == width and out.height == height

    layers = [
        (splat_alpha(p, s, o, focal, width, height), np.concatenate([c, [p[2]]]))
        for p, s, o, c in sorted(zip(points, scales, opacities, colors), key=lambda t: t[0][2])
    ]
    feats, expected_alpha, _ = composite(layers)
    expected_rgb = feats[..., :3] + (1 - expected_alpha)[..., None] * np.array(BACKGROUND)
    expected_depth = feats[..., 3] / np.maximum(expected_alpha, 1e-10)
    assert expected_alpha[:, -1].max() > 0.1 and expected_alpha[-1, :].max() > 0.1  # edges are lit
    assert expected_alpha[-1, -1] > 0.1  # so is the corner
    np.testing.assert_allclose(as_np(out.alpha[..., 0]), expected_alpha, atol=EXACT_ATOL, rtol=0)
    np.testing.assert_allclose(as_np(out.rgb), expected_rgb, atol=EXACT_ATOL, rtol=0)
    np.testing.assert_allclose(as_np(out.depth[..., 0]), expected_depth, atol=1e-10, rtol=1e-10)
    for pix in [(height - 1, width - 1), (height - 1, 0), (0, width - 1), (height - 1, 3), (5, width - 1)]:
        np.testing.assert_allclose(as_np(out.rgb[pix]), expected_rgb[pix], atol=EXACT_ATOL, rtol=0)


# ----------------------------------------------------------------------------------------------
# Spherical harmonics
# ----------------------------------------------------------------------------------------------


def _colour_seen(splats, cam, sh_degree) -> np.ndarray:
    """The splat's colour, read at the pixel under its centre as rgb / alpha (no background)."""
    out = rasterize(splats, cam, options(background=None, sh_degree=sh_degree))
    col, row = (int(v) for v in as_np(out.means2d[0, 0]))
    assert float(out.alpha[row, col, 0]) > 0.5
    return as_np(out.rgb[row, col] / out.alpha[row, col])


def test_sh_degree0_is_scaled_dc_plus_half_clamped_at_zero():
    torch.manual_seed(9)
    cam = tilted_camera(24, 20, 25.0)
    dc = np.array([0.7, -0.2, -3.0])  # the last channel goes negative and clamps to 0
    coeffs = np.zeros((1, 4, 3))
    coeffs[0, 0] = dc
    coeffs[0, 1:] = [[0.3, -0.4, 0.5]] * 3  # ignored at degree 0
    splats = iso_splats([(0.1, -0.1, 3.0)], [0.2], [0.9], coeffs.tolist(), cam)
    expected = np.maximum(dc * SH_C0 + 0.5, 0.0)
    assert expected[2] == 0.0
    np.testing.assert_allclose(_colour_seen(splats, cam, 0), expected, atol=EXACT_ATOL, rtol=0)


@pytest.mark.parametrize("band", [1, 2, 3])
def test_sh_degree1_sign_convention(band: int):
    """gsplat's degree-1 bases at the unit direction (x, y, z) from the camera to the splat, in world
    axes: -C1 y, +C1 z, -C1 x (coefficients 1, 2, 3)."""
    torch.manual_seed(10 + band)
    width, height, focal = 24, 20, 25.0
    cam_pos = np.array([0.7, -0.4, -2.0])
    cam_rot = rotation((0.2, 1.0, -0.3), 0.5) @ rotation((1.0, 0.0, 0.0), 0.3)
    cam = camera(width, height, focal, view=viewmat(cam_rot, tuple(cam_pos)))
    point_cam = torch.tensor([[0.4, -0.3, 2.5]], dtype=F64)
    point_world = camera_to_world(point_cam, cam)[0].numpy()
    direction = (point_world - cam_pos) / np.linalg.norm(point_world - cam_pos)
    assert np.all(np.abs(direction) > 0.1) and len(set(np.round(np.abs(direction), 3))) == 3

    coeff = np.array([0.6, -0.6, 0.3])
    coeffs = np.zeros((1, 4, 3))
    coeffs[0, band] = coeff
    splats = iso_splats(point_cam[0].tolist(), [0.2], [0.9], coeffs.tolist(), cam)
    basis = {1: -SH_C1 * direction[1], 2: SH_C1 * direction[2], 3: -SH_C1 * direction[0]}[band]
    np.testing.assert_allclose(_colour_seen(splats, cam, 1), basis * coeff + 0.5, atol=EXACT_ATOL, rtol=0)
    # Evaluated at degree 0 the band is ignored.
    np.testing.assert_allclose(_colour_seen(splats, cam, 0), [0.5, 0.5, 0.5], atol=EXACT_ATOL, rtol=0)


# ----------------------------------------------------------------------------------------------
# Depth
# ----------------------------------------------------------------------------------------------


def test_render_depth_of_opaque_splat_is_its_camera_z():
    """Expected depth = composited z / alpha: one splat gives its camera-space z (not its distance)
    wherever alpha > 0, and 0 where nothing was drawn."""
    torch.manual_seed(12)
    width, height, focal = 40, 30, 35.0
    cam = tilted_camera(width, height, focal)
    z = 3.7
    point = (0.9, -0.5, z)
    out = rasterize(iso_splats([point], [0.25], [0.99], [[1.0, 1.0, 1.0]], cam), cam, options(render_depth=True))
    drawn = out.alpha[..., 0] > 0
    assert drawn.sum() > 20 and (~drawn).sum() > 20
    assert float(out.alpha.max()) > 0.98
    np.testing.assert_allclose(as_np(out.depth[..., 0][drawn]), z, atol=1e-12, rtol=1e-12)
    assert (out.depth[..., 0][~drawn] == 0).all()
    assert math.dist((0, 0, 0), point) - z > 0.1  # distance and z differ for this splat
    no_depth = rasterize(iso_splats([point], [0.25], [0.99], [[1.0, 1.0, 1.0]], cam), cam, options())
    assert no_depth.depth is None


# ----------------------------------------------------------------------------------------------
# Gradients
# ----------------------------------------------------------------------------------------------


def _random_splats(seed: int, n: int, cam, sh_degree, requires_grad=True, **spec):
    gen = torch.Generator().manual_seed(seed)
    spec.setdefault("opacity_range", (0.3, 0.7))
    spec.setdefault("footprint_px", (1.5, 4.0))
    scene = random_scene(SceneSpec(count=n, sh_degree=sh_degree, **spec), cam, gen)
    return make_splats(**scene, requires_grad=requires_grad)


def test_absgrad_bounds_the_gradient_magnitude():
    """After backward, means2d.absgrad [1, N, 2] holds sum_pixels |d loss / d mean2d|, which is at
    least |sum_pixels d loss / d mean2d| = |means2d.grad| elementwise."""
    torch.manual_seed(13)
    width, height = 40, 30
    cam = tilted_camera(width, height, 35.0)
    n = 12
    splats = _random_splats(13, n, cam, 2, pixel_margin=4.0)
    out = rasterize(splats, cam, options(sh_degree=2, render_depth=True))
    out.means2d.retain_grad()
    w = torch.randn(height, width, 3, dtype=F64)
    ((out.rgb * w).sum() + out.depth.sum()).backward()
    absgrad, grad = out.means2d.absgrad, out.means2d.grad
    assert absgrad.shape == (1, n, 2) and grad.shape == (1, n, 2)
    assert (absgrad >= grad.abs() - ABSGRAD_SLACK).all()
    assert (absgrad > grad.abs() + 1e-6).any()  # per-pixel gradients do cancel somewhere
    visible = out.radii[0] > 0
    assert visible.sum() >= n // 2
    assert (absgrad[0, ~visible] == 0).all()


def test_absgrad_of_symmetric_splat_is_positive_while_grad_cancels():
    """A centred round splat under a uniform loss: the pixel gradients cancel (grad ~ 0) but
    their absolute values do not (absgrad > 0)."""
    torch.manual_seed(14)
    cam = camera(33, 33, 50.0)  # the splat projects onto the centre of pixel (16, 16)
    splats = iso_splats([(0.0, 0.0, 4.0)], [0.2], [0.8], [[0.5, 0.5, 0.5]], cam, requires_grad=True)
    out = rasterize(splats, cam, options())
    out.means2d.retain_grad()
    out.rgb.sum().backward()
    assert out.means2d.grad.abs().max() < 1e-12
    assert (out.means2d.absgrad > 0.1).all()


def test_no_absgrad_when_disabled():
    torch.manual_seed(15)
    cam = camera(33, 33, 50.0)
    splats = iso_splats([(0.0, 0.0, 4.0)], [0.2], [0.8], [[0.5, 0.5, 0.5]], cam, requires_grad=True)
    out = rasterize(splats, cam, options(absgrad=False))
    out.means2d.retain_grad()
    out.rgb.sum().backward()
    assert not hasattr(out.means2d, "absgrad")
    assert out.means2d.grad is not None


def test_chunking_does_not_change_the_result(monkeypatch):
    """The reference composites tiles in chunks padded to their longest splat list; forcing many
    small chunks must give the same image and gradients (up to summation order)."""
    import bytesplat_ns.render.torch_backend as torch_backend

    torch.manual_seed(16)
    width, height = 50, 40  # 4x3 tiles of uneven load
    cam = tilted_camera(width, height, 40.0)
    w = torch.randn(height, width, 3, dtype=F64)

    def run():
        splats = _random_splats(16, 40, cam, 1, pixel_margin=10.0)
        out = rasterize(splats, cam, options(sh_degree=1, render_depth=True))
        out.means2d.retain_grad()
        ((out.rgb * w).sum() + out.depth.sum()).backward()
        grads = [getattr(splats, k).grad for k in ("means", "quats", "scales", "opacities", "colors")]
        return [out.rgb, out.alpha, out.depth, out.means2d.grad, out.means2d.absgrad, *grads]

    whole = run()
    monkeypatch.setattr(torch_backend, "PAIRS_PER_CHUNK", 300)  # about one tile per chunk
    chunked = run()
    for a, b in zip(chunked, whole):
        torch.testing.assert_close(a, b, atol=1e-10, rtol=1e-10)


def test_sh_coefficients_in_two_parts_render_as_joined():
    """The model passes features_dc and features_rest apart (colors [N, 3], sh_rest [N, K - 1, 3]): the same image
    and gradients as the joined [N, K, 3]; shapes that do not fit either form are refused."""
    cam = tilted_camera(40, 30, 35.0)
    w = torch.randn(30, 40, 3, dtype=F64, generator=torch.Generator().manual_seed(18))

    def run(splats):
        out = rasterize(splats, cam, options(sh_degree=2))
        (out.rgb * w).sum().backward()
        return [out.rgb, splats.means.grad, colors_grad(splats)]

    joined = _random_splats(18, 20, cam, 2, pixel_margin=4.0)
    for a, b in zip(run(in_two_parts(joined)), run(joined)):
        torch.testing.assert_close(a, b, atol=1e-12, rtol=1e-12)
    parts = in_two_parts(joined)
    with pytest.raises(ValueError, match="two parts"):
        rasterize(dataclasses.replace(parts, sh_rest=parts.sh_rest[:, :, :2]), cam, options(sh_degree=2))
    with pytest.raises(ValueError, match="no sh_rest"):
        rasterize(parts, cam, options(sh_degree=None))


@pytest.mark.parametrize("count", [0, 2])
def test_view_with_nothing_visible_still_backpropagates(count: int):
    torch.manual_seed(17)
    cam = camera(37, 23, 30.0)
    points = [(0.0, 0.0, -3.0), (0.5, 0.0, -1.0)][:count]  # behind the camera
    splats = iso_splats(points or np.zeros((0, 3)), [0.3] * count, [0.5] * count, np.zeros((count, 3)), cam, True)
    out = rasterize(splats, cam, options(render_depth=True))
    assert (out.radii == 0).all()
    np.testing.assert_array_equal(as_np(out.rgb), np.broadcast_to(np.array(BACKGROUND), (23, 37, 3)))
    (out.rgb.sum() + out.depth.sum()).backward()
    assert (splats.means.grad == 0).all() and (splats.opacities.grad == 0).all()


GRADCHECK_CASES = {
    # name: (seed, count, sh_degree, render_depth, fast_mode)
    "rgb": (20, 5, None, True, False),
    "sh1": (21, 6, 1, True, False),
    "sh3": (22, 5, 3, False, True),
}


@pytest.mark.parametrize("case", list(GRADCHECK_CASES))
def test_gradcheck_float64(case: str):
    """Autograd gradients of a random weighting of rgb/alpha(/depth) against finite differences, with
    respect to means, quats, scales, opacities and colours. Scenes keep clear of the cut-offs:
    moderate opacities, 1.5-4 px footprints, centres inside the image."""
    seed, n, sh_degree, render_depth, fast_mode = GRADCHECK_CASES[case]
    torch.manual_seed(seed)
    width, height = 20, 18
    cam = tilted_camera(width, height, 18.0)
    splats = _random_splats(seed, n, cam, sh_degree)
    opts = options(sh_degree=sh_degree, render_depth=render_depth, absgrad=False)
    w_rgb = torch.rand(height, width, 3, dtype=F64)
    w_alpha = torch.randn(height, width, 1, dtype=F64)
    w_depth = 0.1 * torch.randn(height, width, 1, dtype=F64)

    def loss(means, quats, scales, opacities, colors):
        out = rasterize(type(splats)(means, quats, scales, opacities, colors), cam, opts)
        total = (out.rgb * w_rgb).sum() + (out.alpha * w_alpha).sum()
        if render_depth:
            total = total + (out.depth * w_depth).sum()
        return total

    inputs = (splats.means, splats.quats, splats.scales, splats.opacities, splats.colors)
    visible = rasterize(splats, cam, opts).radii[0] > 0
    assert visible.all()
    assert torch.autograd.gradcheck(
        loss, inputs, eps=GRADCHECK_EPS, atol=GRADCHECK_ATOL, rtol=GRADCHECK_RTOL, fast_mode=fast_mode
    )
