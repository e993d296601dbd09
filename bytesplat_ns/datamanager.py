"""ByteSplat's datamanager: nerfstudio's full-image datamanager that checks the scene before caching it,
and the per-rank camera sharding that multi-GPU training uses."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from nerfstudio.data.datamanagers.full_images_datamanager import FullImageDatamanager, FullImageDatamanagerConfig

from bytesplat_ns.input_checks import check_dataparser_outputs


@dataclass
class ByteSplatDatamanagerConfig(FullImageDatamanagerConfig):
    _target: type = field(default_factory=lambda: ByteSplatDatamanager)


class ByteSplatDatamanager(FullImageDatamanager):
    """Fails with a BadInputError naming the image and the fix, before any image is cached."""

    def create_train_dataset(self):
        check_dataparser_outputs(self.train_dataparser_outputs, "train")
        return super().create_train_dataset()

    def create_eval_dataset(self):
        dataset = super().create_eval_dataset()
        check_dataparser_outputs(dataset._dataparser_outputs, "eval")
        return dataset


def camera_shard(num_cameras: int, world_size: int, rank: int, epoch: int, seed: int) -> list[int]:
    """This rank's training cameras for an epoch: one permutation shared by all ranks (seeded by seed + epoch),
    dealt round-robin, so the shards are disjoint, cover every camera and differ in size by at most one."""
    generator = torch.Generator().manual_seed(seed + epoch)
    return torch.randperm(num_cameras, generator=generator)[rank::world_size].tolist()
