"""A small, deterministic, procedurally rendered scene for trying bytesplat without downloads.

The scene is a still life that is *not* made of Gaussians, so fitting it is an honest test:

* a square plinth (an axis-aligned slab) with a checkerboard top and shaded terracotta sides,
* a large sphere with soft horizontal stripes,
* an axis-aligned cube with a 3D checker texture,
* two smaller spheres with smooth colour gradients.

Everything is ray traced with vectorised numpy. Shading is Lambertian from a key light (which
casts hard shadows) and a dim fill light, plus ambient, plus a Blinn-Phong highlight from the key
light, which makes the appearance view dependent. Every pixel is 2x2 supersampled. The background
is transparent: images are 8-bit RGBA with straight (un-premultiplied) colour and fractional
alpha along silhouettes.

The output follows nerfstudio's "nerfstudio-data" layout::

    output_dir/
        transforms.json           # shared OPENCV intrinsics, frames, explicit train/val/test lists
        images/frame_00000.png    # one RGBA image per camera
        sparse_pc.ply             # num_points coloured surface points for initialisation

The world frame has +Z up and the plinth top at z=0. Camera-to-world matrices use the
nerfstudio/OpenGL convention (the camera looks down -Z, +Y is up, +X is right). All cameras lie
on one Fibonacci spiral over the upper hemisphere, looking at the scene centre; the held-out views
(written as both the val and the test split) are spread evenly along that spiral, between the
training views. The point cloud is sampled from ray hits of the training views, with the rendered
(shaded) colour and a little positional noise.

The `room` layout puts the still life inside a closed room (plank floor, a wallpaper of its own
hue on each wall, a ceiling with a grid) and the cameras inside the room, around the still life,
each looking its own horizontal way: every pixel is opaque, and each view sees only a part of the
scene, as in a capture of a room from inside. The key light shines through the ceiling as if it
were glass (the room's surfaces cast no shadows; the still life's shadows fall on the floor).
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing
from collections.abc import Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image


@dataclass(frozen=True)
class DemoSceneConfig:
    """Size and randomness of the generated demo scene."""

    width: int = 128
    """Image width in pixels."""
    height: int = 128
    """Image height in pixels."""
    num_train: int = 48
    """Number of training views."""
    num_eval: int = 8
    """Number of held-out views (listed as both the val and the test split)."""
    num_points: int = 4000
    """Number of points in the sparse initialisation point cloud."""
    seed: int = 0
    """Seed for the camera jitter, the point sampling and the point noise."""
    layout: str = "still_life"
    """still_life: cameras around the objects, transparent background; room: the objects inside a closed room,
    cameras inside it looking outwards, so that each view sees only a part of the scene."""


# Primitives, world units, +Z up: ("box", min corner, max corner), ("sphere", centre, radius) or ("room", min
# corner, max corner): a box seen from inside. The index is the object id of the texture and material tables below.
PRIMITIVES: list[tuple[str, np.ndarray, object]] = [
    ("box", np.array([-0.9, -0.9, -0.25]), np.array([0.9, 0.9, 0.0])),  # 0: plinth
    ("box", np.array([0.15, 0.1, 0.0]), np.array([0.7, 0.65, 0.55])),  # 1: cube
    ("sphere", np.array([-0.35, -0.25, 0.45]), 0.45),  # 2: striped sphere
    ("sphere", np.array([0.45, -0.5, 0.22]), 0.22),  # 3: blue-green sphere
    ("sphere", np.array([-0.5, 0.5, 0.18]), 0.18),  # 4: orange-pink sphere
]
ROOM = ("room", np.array([-3.0, -3.0, -0.25]), np.array([3.0, 3.0, 2.5]))  # 5: the room (layout "room")
LAYOUTS = {"still_life": PRIMITIVES, "room": [*PRIMITIVES, ROOM]}
SPECULAR = np.array([0.08, 0.2, 0.45, 0.35, 0.6, 0.05])  # Blinn-Phong strength per object id
SHININESS = np.array([8.0, 16.0, 40.0, 30.0, 60.0, 8.0])  # Blinn-Phong exponent per object id
WALL_RGB = np.array([[0.62, 0.5, 0.3], [0.3, 0.45, 0.6], [0.55, 0.3, 0.35], [0.35, 0.55, 0.35]])  # -x, +x, -y, +y

KEY_DIR = np.array([0.45, -0.55, 0.7]) / np.linalg.norm([0.45, -0.55, 0.7])  # towards the light
KEY_RGB = np.array([1.0, 0.95, 0.85])
FILL_DIR = np.array([-0.6, 0.5, 0.35]) / np.linalg.norm([-0.6, 0.5, 0.35])
FILL_RGB = np.array([0.25, 0.3, 0.4])
AMBIENT = 0.15
GAMMA = 2.2  # shading is computed in linear space, images are gamma encoded

LOOK_AT = np.array([0.0, 0.0, 0.2])  # all cameras look at this point
RADIUS_RANGE = (3.6, 4.0)  # camera distance from LOOK_AT
ELEVATION_RANGE_DEG = (12.0, 65.0)
ROOM_RADIUS_RANGE = (1.5, 2.3)  # room layout: camera distance from the room's vertical axis
ROOM_HEIGHT_RANGE = (0.3, 1.4)  # room layout: camera height
ROOM_PITCH_RANGE_DEG = (-25.0, 10.0)  # room layout: camera pitch (the yaw goes all around)
FOV_DEG = 48.0  # field of view across the shorter image side
SUPERSAMPLE = 2  # SxS samples per pixel
POINT_NOISE = 0.005  # std-dev of the point-cloud position noise, world units
EPS = 1e-4


def _intersect(origins: np.ndarray, dirs: np.ndarray, primitives: list) -> tuple[np.ndarray, np.ndarray]:
    """Nearest hit of rays [N, 3] (unit dirs [N, 3]): distance [N] (inf = miss), object id [N] (-1 = miss)."""
    best_t = np.full(len(origins), np.inf)
    best_id = np.full(len(origins), -1)
    for obj_id, (kind, a, b) in enumerate(primitives):
        if kind == "sphere":
            oc = origins - a  # [N, 3]
            half_b = np.einsum("ij,ij->i", oc, dirs)
            disc = half_b**2 - (np.einsum("ij,ij->i", oc, oc) - b**2)
            root = np.sqrt(np.maximum(disc, 0.0))
            t_near, t_far = -half_b - root, -half_b + root
            t = np.where(t_near > EPS, t_near, np.where(t_far > EPS, t_far, np.inf))
            t = np.where(disc >= 0.0, t, np.inf)
        else:  # slab test for an axis-aligned box (from inside a room: the exit)
            with np.errstate(divide="ignore", invalid="ignore"):
                inv = 1.0 / dirs
                t0, t1 = (a - origins) * inv, (b - origins) * inv  # [N, 3]
            t_enter = np.nanmax(np.minimum(t0, t1), axis=1)
            t_exit = np.nanmin(np.maximum(t0, t1), axis=1)
            t = np.where(t_enter > EPS, t_enter, t_exit)
            t = np.where((t_exit >= t_enter) & (t > EPS), t, np.inf)
        closer = t < best_t
        best_t[closer], best_id[closer] = t[closer], obj_id
    return best_t, best_id


def _normals(points: np.ndarray, obj: np.ndarray, primitives: list) -> np.ndarray:
    """Unit normals [N, 3] at surface points [N, 3] of objects obj [N], towards the side the cameras see."""
    normals = np.zeros_like(points)
    for obj_id, (kind, a, b) in enumerate(primitives):
        sel = obj == obj_id
        if kind == "sphere":
            normals[sel] = (points[sel] - a) / b
        else:  # the face whose plane is closest, relative to the half extent
            offset = (points[sel] - (a + b) / 2) / ((b - a) / 2)  # [M, 3], in [-1, 1]
            axis = np.argmax(np.abs(offset), axis=1)
            rows = np.arange(len(axis))
            inward = -1.0 if kind == "room" else 1.0
            normals[np.flatnonzero(sel), axis] = inward * np.sign(offset[rows, axis])
    return normals


def _checker(coords: np.ndarray, cell: float) -> np.ndarray:
    """0/1 checker pattern [N] over coordinate columns [N, K] with square size `cell`."""
    return (np.floor(coords / cell).astype(np.int64).sum(axis=1) % 2).astype(np.float64)


def _mix(c0: Sequence[float], c1: Sequence[float], t: np.ndarray) -> np.ndarray:
    """Blend two colours by weights t [N] -> [N, 3]."""
    return np.asarray(c0) * (1.0 - t[:, None]) + np.asarray(c1) * t[:, None]


def _albedo(points: np.ndarray, normals: np.ndarray, obj: np.ndarray) -> np.ndarray:
    """Procedural surface colour [N, 3] (linear RGB) at points [N, 3] of objects obj [N]."""
    albedo = np.zeros_like(points)
    p, n = points, normals
    s = obj == 0  # plinth: 6x6 checkerboard on top, terracotta sides darkening downwards
    top = s & (n[:, 2] > 0.5)
    side = s & ~top
    albedo[top] = _mix((0.8, 0.78, 0.7), (0.12, 0.16, 0.28), _checker(p[top, :2] + 0.9, 0.3))
    albedo[side] = np.array([0.55, 0.25, 0.15]) * (1.0 + 2.0 * p[side, 2:3])
    s = obj == 1  # cube: 3x3 checker on every face (sampled just inside, off the cell borders)
    cell = 0.55 / 3
    inside = p[s] - 0.5 * cell * n[s] - PRIMITIVES[1][1]
    albedo[s] = _mix((0.85, 0.6, 0.08), (0.08, 0.4, 0.15), _checker(inside, cell))
    s = obj == 2  # big sphere: soft horizontal red / cream stripes
    stripes = 0.5 + 0.5 * np.tanh(4.0 * np.sin(2.0 * math.pi * p[s, 2] / 0.3))
    albedo[s] = _mix((0.75, 0.08, 0.05), (0.9, 0.82, 0.6), stripes)
    s = obj == 3  # blue at the bottom to green at the top
    albedo[s] = _mix((0.05, 0.12, 0.7), (0.15, 0.7, 0.5), 0.5 + 0.5 * n[s, 2])
    s = obj == 4  # orange to pink along x
    albedo[s] = _mix((0.85, 0.4, 0.05), (0.7, 0.1, 0.4), 0.5 + 0.5 * n[s, 0])
    floor, ceiling = (obj == 5) & (n[:, 2] > 0.5), (obj == 5) & (n[:, 2] < -0.5)
    wall = (obj == 5) & ~floor & ~ceiling
    plank = np.floor(p[floor, 1] / 0.2)  # floor: planks 0.2 wide along x, each its own shade, with a grain
    shade = (plank * 0.618034) % 1.0 + 0.15 * np.sin(p[floor, 0] * 23.0 + plank)
    albedo[floor] = _mix((0.42, 0.26, 0.13), (0.66, 0.45, 0.24), np.clip(shade, 0.0, 1.0))
    ceiling_grid = _checker(p[ceiling, :2], 0.5)
    albedo[ceiling] = _mix((0.9, 0.88, 0.82), (0.75, 0.74, 0.7), ceiling_grid)
    side = np.where(np.abs(n[wall, 0]) > 0.5, n[wall, 0] < 0, 2 + (n[wall, 1] < 0))  # -x, +x, -y, +y wall
    paper = 0.5 * _checker(p[wall], 0.3) + 0.3 * (np.sin(p[wall, :2].sum(axis=1) * 9.0) > 0.6)  # [M] in [0, 0.8]
    dado = (p[wall, 2] < 0.6)[:, None]  # a darker band along the floor
    albedo[wall] = WALL_RGB[side] * (1.0 - 0.6 * paper[:, None]) * np.where(dado, 0.55, 1.0)
    return albedo


def _shade(origins: np.ndarray, dirs: np.ndarray, primitives: list) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Trace rays [N, 3]: gamma-encoded colour [N, 3] in [0, 1], hit mask [N], hit points [N, 3]."""
    t, obj = _intersect(origins, dirs, primitives)
    hit = obj >= 0
    rgb = np.zeros_like(origins)
    points = origins + dirs * np.where(hit, t, 0.0)[:, None]  # [N, 3]
    p, d, o = points[hit], dirs[hit], obj[hit]
    n = _normals(p, o, primitives)  # [M, 3]
    _, blocker = _intersect(p + n * 1e-3, np.broadcast_to(KEY_DIR, p.shape), PRIMITIVES)  # the room casts none
    lit = (blocker < 0).astype(np.float64)[:, None]  # [M, 1], 0 where the key light is shadowed
    key = np.clip(n @ KEY_DIR, 0.0, None)[:, None] * lit
    fill = np.clip(n @ FILL_DIR, 0.0, None)[:, None]
    diffuse = _albedo(p, n, o) * (AMBIENT + key * KEY_RGB + fill * FILL_RGB)
    half = KEY_DIR - d
    half /= np.linalg.norm(half, axis=1, keepdims=True)
    spec = np.clip(np.einsum("ij,ij->i", n, half), 0.0, None) ** SHININESS[o] * SPECULAR[o]
    linear = diffuse + spec[:, None] * (key > 0) * KEY_RGB
    rgb[hit] = np.clip(linear, 0.0, 1.0) ** (1.0 / GAMMA)
    return rgb, hit, points


def _camera_poses(config: DemoSceneConfig, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Camera-to-world matrices [N, 4, 4] of the config's layout, and held-out flags [N] (spread evenly)."""
    total = config.num_train + config.num_eval
    positions, forward = (_room_views if config.layout == "room" else _orbit_views)(total, rng)  # [N, 3] each
    right = np.cross(forward, [0.0, 0.0, 1.0])
    right /= np.linalg.norm(right, axis=1, keepdims=True)
    up = np.cross(right, forward)
    c2w = np.tile(np.eye(4), (total, 1, 1))  # [N, 4, 4]
    c2w[:, :3, 0], c2w[:, :3, 1], c2w[:, :3, 2], c2w[:, :3, 3] = right, up, -forward, positions
    is_eval = np.zeros(total, dtype=bool)
    is_eval[((np.arange(config.num_eval) + 0.5) * total / max(config.num_eval, 1)).astype(int)] = True
    return c2w, is_eval


def _orbit_views(total: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Still life: positions [N, 3] on a jittered Fibonacci spiral around LOOK_AT, unit forward vectors [N, 3]
    towards it."""
    index = np.arange(total)
    lo, hi = (math.sin(math.radians(e)) for e in ELEVATION_RANGE_DEG)
    height = lo + (hi - lo) * (index + 0.5 + rng.uniform(-0.3, 0.3, total)) / total  # [N] sin(elevation)
    azimuth = index * math.pi * (3.0 - math.sqrt(5.0)) + rng.uniform(-0.15, 0.15, total)  # golden angle
    radius = rng.uniform(*RADIUS_RANGE, total)
    ring = np.sqrt(1.0 - height**2)
    offsets = np.stack([ring * np.cos(azimuth), ring * np.sin(azimuth), height], axis=1)  # [N, 3]
    return LOOK_AT + radius[:, None] * offsets, -offsets


def _room_views(total: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Room: positions [N, 3] around the still life, each looking its own horizontal way (yaws spread by the golden
    ratio, so that the views together cover every direction), unit forward vectors [N, 3]."""
    around = rng.uniform(0.0, 2.0 * math.pi, total)  # where the camera stands
    radius = rng.uniform(*ROOM_RADIUS_RANGE, total)
    height = rng.uniform(*ROOM_HEIGHT_RANGE, total)
    positions = np.stack([radius * np.cos(around), radius * np.sin(around), height], axis=1)  # [N, 3]
    yaw = 2.0 * math.pi * ((np.arange(total) * 0.618034 + rng.uniform(-0.05, 0.05, total)) % 1.0)
    pitch = np.radians(rng.uniform(*ROOM_PITCH_RANGE_DEG, total))
    forward = np.stack([np.cos(pitch) * np.cos(yaw), np.cos(pitch) * np.sin(yaw), np.sin(pitch)], axis=1)
    return positions, forward


def _render_view(c2w: np.ndarray, focal: float, width: int, height: int, layout: str):
    """Render one camera: straight-alpha RGBA [H, W, 4] in [0, 1], hit points [M, 3], colours [M, 3]."""
    s = SUPERSAMPLE
    u = (np.arange(width * s) + 0.5) / s  # sub-pixel x coordinates, pixel i covers [i, i + 1)
    v = (np.arange(height * s) + 0.5) / s
    uu, vv = np.meshgrid(u, v)  # [sH, sW]
    cam_dirs = np.stack([(uu - width / 2) / focal, -(vv - height / 2) / focal, -np.ones_like(uu)], -1)
    dirs = cam_dirs.reshape(-1, 3) @ c2w[:3, :3].T  # [sH*sW, 3]
    dirs /= np.linalg.norm(dirs, axis=1, keepdims=True)
    origins = np.broadcast_to(c2w[:3, 3], dirs.shape)
    rgb, hit, points = _shade(origins, dirs, LAYOUTS[layout])
    hits = hit.reshape(height, s, width, s).astype(np.float64)
    alpha = hits.mean(axis=(1, 3))  # [H, W]
    colour_sum = (rgb * hit[:, None]).reshape(height, s, width, s, 3).sum(axis=(1, 3))  # [H, W, 3]
    colour = colour_sum / np.maximum(hits.sum(axis=(1, 3)), 1.0)[..., None]  # un-premultiplied
    return np.concatenate([colour, alpha[..., None]], axis=-1), points[hit], rgb[hit]


def _write_ply(path: Path, xyz: np.ndarray, rgb: np.ndarray) -> None:
    """Binary little-endian PLY with float x, y, z [N, 3] and uchar red, green, blue [N, 3]."""
    fields = [("x", "<f4"), ("y", "<f4"), ("z", "<f4"), ("red", "u1"), ("green", "u1"), ("blue", "u1")]
    data = np.empty(len(xyz), dtype=fields)
    for i, name in enumerate("xyz"):
        data[name] = xyz[:, i]
    for i, name in enumerate(("red", "green", "blue")):
        data[name] = rgb[:, i]
    header = ["ply", "format binary_little_endian 1.0", f"element vertex {len(xyz)}"]
    header += [f"property {'float' if kind == '<f4' else 'uchar'} {name}" for name, kind in fields]
    with open(path, "wb") as f:
        f.write(("\n".join(header + ["end_header"]) + "\n").encode("ascii"))
        f.write(data.tobytes())


def _renders(c2w: np.ndarray, focal: float, config: DemoSceneConfig, workers: int) -> Iterator[tuple]:
    """_render_view of each camera [N, 4, 4], in order; with workers > 1, that many at once in other processes
    (a batch at a time, so that at most `workers` views' hit points are held)."""
    if workers <= 1:
        yield from (_render_view(pose, focal, config.width, config.height, config.layout) for pose in c2w)
        return
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        for start in range(0, len(c2w), workers):
            batch = list(c2w[start : start + workers])
            n = len(batch)
            try:
                yield from pool.map(_render_view, batch, [focal] * n, [config.width] * n, [config.height] * n,
                                    [config.layout] * n)  # fmt: skip
            except BrokenProcessPool as error:
                raise RuntimeError(
                    f"A process rendering the scene ({workers} at once) stopped. Worker processes are spawned: the "
                    "calling script must be a file whose own work runs under `if __name__ == '__main__':` (a script "
                    "read from stdin cannot be re-imported); a 1920x1080 view also takes a few GB per process. "
                    "Fix the script, or pass fewer workers (1 renders in this process)."
                ) from error


def generate_demo_scene(output_dir: Path, config: DemoSceneConfig = DemoSceneConfig(), workers: int = 1) -> Path:
    """Write the scene into output_dir (created if needed); returns output_dir. `workers`: views rendered at once,
    each in its own spawned process (a 1920x1080 view takes seconds and gigabytes; the calling script then needs
    an `if __name__ == "__main__":` guard).

    Deterministic: the same config gives byte-identical files, with any number of workers.
    """
    if min(config.width, config.height, config.num_train, config.num_eval, config.num_points) < 1:
        raise ValueError(f"All sizes and counts must be positive, got {config}")
    if config.layout not in LAYOUTS:
        raise ValueError(f"Unknown layout {config.layout!r}; use one of {sorted(LAYOUTS)}")
    output_dir = Path(output_dir)
    (output_dir / "images").mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(config.seed)
    c2w, is_eval = _camera_poses(config, rng)
    focal = 0.5 * min(config.width, config.height) / math.tan(math.radians(FOV_DEG) / 2)
    per_view = math.ceil(config.num_points / config.num_train)
    frames, train_names, eval_names, cloud_xyz, cloud_rgb = [], [], [], [], []
    for i, (pose, (rgba, hit_xyz, hit_rgb)) in enumerate(zip(c2w, _renders(c2w, focal, config, workers))):
        name = f"images/frame_{i:05d}.png"
        pixels = np.round(rgba * 255.0).astype(np.uint8)  # [H, W, 4]
        Image.fromarray(pixels).save(output_dir / name)
        frames.append({"file_path": name, "transform_matrix": pose.tolist()})
        (eval_names if is_eval[i] else train_names).append(name)
        if not is_eval[i] and len(hit_xyz) > 0:  # candidate points seen by this training view
            pick = rng.choice(len(hit_xyz), size=per_view, replace=len(hit_xyz) < per_view)
            cloud_xyz.append(hit_xyz[pick])
            cloud_rgb.append(hit_rgb[pick])
    xyz, rgb = np.concatenate(cloud_xyz), np.concatenate(cloud_rgb)  # [K, 3] each
    pick = rng.choice(len(xyz), size=config.num_points, replace=len(xyz) < config.num_points)
    xyz = xyz[pick] + rng.normal(scale=POINT_NOISE, size=(config.num_points, 3))
    _write_ply(output_dir / "sparse_pc.ply", xyz, np.round(rgb[pick] * 255.0).astype(np.uint8))
    transforms = {
        "camera_model": "OPENCV",
        "fl_x": focal,
        "fl_y": focal,
        "cx": config.width / 2,
        "cy": config.height / 2,
        "w": config.width,
        "h": config.height,
        "k1": 0.0,
        "k2": 0.0,
        "p1": 0.0,
        "p2": 0.0,
        "frames": frames,
        "train_filenames": train_names,
        "val_filenames": eval_names,
        "test_filenames": eval_names,
        "ply_file_path": "sparse_pc.ply",
    }
    (output_dir / "transforms.json").write_text(json.dumps(transforms, indent=2) + "\n")
    return output_dir


def main(argv: Sequence[str] | None = None) -> None:
    """Command line entry point: generate the demo scene into a folder."""
    defaults = DemoSceneConfig()
    parser = argparse.ArgumentParser(description="Render bytesplat's procedural demo scene (nerfstudio-data format).")
    parser.add_argument("--output", type=Path, default=Path("data/bytesplat-demo"), help="output folder")
    parser.add_argument("--width", type=int, default=defaults.width, help="image width in pixels")
    parser.add_argument("--height", type=int, default=defaults.height, help="image height in pixels")
    parser.add_argument("--num-train", type=int, default=defaults.num_train, help="number of training views")
    parser.add_argument("--num-eval", type=int, default=defaults.num_eval, help="number of held-out views")
    parser.add_argument("--num-points", type=int, default=defaults.num_points, help="point-cloud size")
    parser.add_argument("--seed", type=int, default=defaults.seed, help="random seed")
    parser.add_argument("--layout", choices=sorted(LAYOUTS), default=defaults.layout,
                        help="still_life: cameras around the objects; room: inside a room around them")  # fmt: skip
    parser.add_argument("--workers", type=int, default=1, help="views rendered at once, each in its own process")
    args = parser.parse_args(argv)
    config = DemoSceneConfig(
        args.width, args.height, args.num_train, args.num_eval, args.num_points, args.seed, args.layout
    )
    out = generate_demo_scene(args.output, config, workers=args.workers)
    print(f"Wrote demo scene ({config.num_train} train + {config.num_eval} held-out views) to {out.resolve()}")


if __name__ == "__main__":
    main()
