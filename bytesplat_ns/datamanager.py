"""ByteSplat's datamanager: nerfstudio's full-image datamanager that checks the scene before caching it and,
with several ranks, gives each rank its own shard of the training cameras.

Sharding: one permutation of the training cameras, drawn from the shared seed, is dealt round-robin to the
ranks, so the shards are disjoint, cover every camera and differ in size by at most one. The shards stay
fixed for the whole run, so each rank caches only its own shard's images; each epoch every rank draws its
shard in a new order, again from the shared seed (seed, epoch). With one rank, nerfstudio's own sampler
runs unchanged (so a 1-GPU bytesplat run sees the cameras in splatfacto's order).

Matched draws (the default; --pipeline.datamanager.match-view-costs False: each rank shuffles its shard alone): a step
lasts as long as its slowest rank's view, and views differ in cost (on a room seen from inside by 3.7-5.5 ms a step:
benchmarks/view_balance.py), so each epoch every rank orders its shard by what its views cost the last time it
rendered them (their tile-entry counts, read late from the binning: render/bin_capacity.py) and all ranks draw the
same quantile of their own shard at the same step, in an order shared from the seed (`matched_epoch_order`). The
shards are random halves (thirds, ...), so the k-th cheapest views of two shards cost about alike. Every epoch has
ceil(cameras / ranks) steps on every rank, so the ranks stay in step; a shard one camera short draws one of its
cameras twice an epoch. Views not yet rendered count as the median; the first epoch, with none rendered, goes by
camera index.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from functools import cached_property

import torch
import torch.distributed as dist
from nerfstudio.cameras.cameras import Cameras
from nerfstudio.data.datamanagers.full_images_datamanager import FullImageDatamanager, FullImageDatamanagerConfig

from bytesplat_ns.camera_matrices import CameraStack
from bytesplat_ns.input_checks import BadInputError, check_dataparser_outputs


@dataclass
class ByteSplatDatamanagerConfig(FullImageDatamanagerConfig):
    _target: type = field(default_factory=lambda: ByteSplatDatamanager)
    match_view_costs: bool = True
    """With several GPUs: draw views of similar cost at the same step on every rank (module docstring), so the
    ranks wait less for each other (on the 2M-splat room, two H200s: 286 against 282 views/s, held-out PSNR 32.25
    against 32.16 dB; benchmarks/RESULTS.md, thirty-eighth session). False: each rank shuffles its shard alone."""


def camera_shard(num_cameras: int, world_size: int, rank: int, seed: int) -> list[int]:
    """This rank's training cameras: a permutation shared by all ranks (seeded by `seed`), dealt round-robin."""
    generator = torch.Generator().manual_seed(seed)
    return sorted(torch.randperm(num_cameras, generator=generator)[rank::world_size].tolist())


def epoch_order(shard: list[int], seed: int, epoch: int) -> list[int]:
    """The order in which a rank draws its shard in one epoch (seeded by the shared seed and the epoch)."""
    generator = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
    return [shard[i] for i in torch.randperm(len(shard), generator=generator).tolist()]


def matched_epoch_order(shard: list[int], costs: dict[int, float], length: int, seed: int, epoch: int) -> list[int]:
    """A rank's `length` draws of one epoch with matched draws (module docstring): its shard ranked by `costs`
    (camera -> cost; missing: the median), quantile q of the ranking at the step where the shared permutation of
    (seed, epoch) puts q. `length` >= len(shard): a shorter shard repeats cameras."""
    known = sorted(costs[c] for c in shard if c in costs)
    typical = known[len(known) // 2] if known else 0.0
    ranked = sorted(shard, key=lambda c: (costs.get(c, typical), c))
    generator = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
    return [ranked[q * len(ranked) // length] for q in torch.randperm(length, generator=generator).tolist()]


class _ShardView:
    """The part of a dataset that nerfstudio's image cache reads (len, get_data, cameras), limited to a shard."""

    def __init__(self, dataset, shard: list[int]) -> None:
        self.dataset, self.shard = dataset, shard
        self.cameras = dataset.cameras[torch.tensor(shard)]

    def __len__(self) -> int:
        return len(self.shard)

    def get_data(self, index: int, image_type: str):
        return self.dataset.get_data(self.shard[index], image_type=image_type)


class ByteSplatDatamanager(FullImageDatamanager):
    """Fails with a BadInputError naming the image and the fix, before any image is cached."""

    def create_train_dataset(self):
        check_dataparser_outputs(self.train_dataparser_outputs, "train")
        return super().create_train_dataset()

    def create_eval_dataset(self):
        dataset = super().create_eval_dataset()
        check_dataparser_outputs(dataset._dataparser_outputs, "eval")
        return dataset

    @cached_property
    def shard(self) -> list[int]:
        """The training cameras this rank trains on (all of them with one rank)."""
        num_cameras = len(self.train_dataset)
        if self.world_size > num_cameras:
            raise BadInputError(
                f"{self.world_size} GPUs need at least {self.world_size} training images (one per GPU); the scene "
                f"has {num_cameras}. Use fewer GPUs (--machine.num-devices)."
            )
        if self.world_size > 1 and self.config.train_cameras_sampling_strategy != "random":
            raise BadInputError(
                "Several GPUs draw disjoint camera shards; --pipeline.datamanager.train-cameras-sampling-strategy "
                f"{self.config.train_cameras_sampling_strategy} works on one GPU only. Use random (the default)."
            )
        return camera_shard(num_cameras, self.world_size, self.global_rank, self.config.train_cameras_sampling_seed)

    @property
    def global_rank(self) -> int:
        """This process's rank among all machines' (nerfstudio passes only the local rank)."""
        return dist.get_rank() if self.world_size > 1 else 0

    view_costs: dict[int, float] | None = None
    """Training camera -> what its last render cost (its binning's entries), for matched draws; set by the
    pipeline (the model's BinCapacity.entries_by_view)."""

    def sample_train_cameras(self) -> list[int]:
        if self.world_size == 1:
            return super().sample_train_cameras()
        self.epoch = getattr(self, "epoch", -1) + 1
        seed = self.config.train_cameras_sampling_seed
        if self.config.match_view_costs:
            length = -(-len(self.train_dataset) // self.world_size)  # the longest shard: every rank alike
            return matched_epoch_order(self.shard, self.view_costs or {}, length, seed, self.epoch)
        return epoch_order(self.shard, seed, self.epoch)

    @cached_property
    def cached_train(self):
        """With several ranks: only this rank's shard is loaded (other entries are None)."""
        if self.world_size == 1:
            return super().cached_train
        full, view = self.train_dataset, _ShardView(self.train_dataset, self.shard)
        self.train_dataset = view  # nerfstudio's loader (undistortion included) reads only the shard
        try:
            loaded = self._load_images("train", cache_images_device=self.config.cache_images)
        finally:
            self.train_dataset = full
        index = torch.tensor(self.shard)
        for name in ("fx", "fy", "cx", "cy", "width", "height"):  # undistortion may have changed them
            getattr(full.cameras, name)[index] = getattr(view.cameras, name)
        self.train_cameras = full.cameras.to(self.device) if self.config.cache_images == "gpu" else full.cameras
        cache: list = [None] * len(full)
        for camera, data in zip(self.shard, loaded):
            cache[camera] = data
        return cache

    def next_train(self, step: int):
        """nerfstudio's next training camera and image, as FullImageDatamanager.next_train gives them (same order,
        same values), plus in the camera's metadata the image size as Python ints ("size", so the model needs no
        host sync to read it from the GPU copy of the camera) and its stored matrices (`camera_stack`). The
        one-camera Cameras comes from `camera_views` (nerfstudio slices and copies train_cameras anew every step:
        some fifty small tensor ops, 120 us a step on the CPU machine, benchmarks/RESULTS.md); the caller gets its
        own shallow copy and metadata, so reassigning a field (rescale_output_resolution does) leaves the stored one
        as it was."""
        image_idx = self.train_unseen_cameras.pop(0)
        if not self.train_unseen_cameras:
            self.train_unseen_cameras = self.sample_train_cameras()
        view = self.camera_views.get(image_idx)
        if view is None:
            view = self.camera_views[image_idx] = self.train_cameras[image_idx : image_idx + 1].to(self.device)
            view.metadata = {**(view.metadata or {}), "cam_idx": image_idx, "size": self.train_sizes[image_idx],
                             **self.camera_stack.metadata(image_idx)}  # fmt: skip
        camera = copy.copy(view)
        camera.metadata = dict(view.metadata)
        data = dict(self.cached_train[image_idx])  # a copy: the cached dictionary is never changed
        data["image"] = data["image"].to(self.device)
        return camera, data

    @cached_property
    def camera_views(self) -> dict[int, Cameras]:
        """Training camera index -> that camera alone ([1]-shaped Cameras on the training device, a few KB each),
        made on first use."""
        assert len(self.train_cameras.shape) == 1, "nerfstudio's training cameras have one batch dimension"
        return {}

    @cached_property
    def camera_stack(self) -> CameraStack:
        """This rank's training cameras' matrices and images, stacked on the training device (camera_matrices.py);
        made on first use, after the images are cached (undistortion may change the intrinsics)."""
        cached = self.cached_train  # first: with several ranks this also sets train_cameras
        return CameraStack.build(self.train_cameras, cached, self.shard, self.device)

    @cached_property
    def train_sizes(self) -> list[tuple[int, int]]:
        """(width, height) of every training camera (read after the images are cached: undistortion may crop)."""
        cameras = self.train_dataset.cameras
        self.cached_train  # noqa: B018  (undistortion, on first use, can change the sizes)
        return list(zip(cameras.width.view(-1).tolist(), cameras.height.view(-1).tolist()))

    def get_train_rays_per_batch(self) -> int:
        image = self.cached_train[self.shard[0]]["image"]
        return image.shape[0] * image.shape[1]
