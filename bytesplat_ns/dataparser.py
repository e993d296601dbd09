"""`bytesplat-data`: nerfstudio-data scenes, with the initial point cloud read by plyfile instead of open3d.

Same transforms.json format and options as nerfstudio's `nerfstudio-data`; only the PLY reader differs,
so training needs no open3d (and no libusb): nerfstudio's own loader imports open3d for that one read.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from nerfstudio.data.dataparsers.nerfstudio_dataparser import Nerfstudio, NerfstudioDataParserConfig
from nerfstudio.plugins.registry_dataparser import DataParserSpecification
from plyfile import PlyData

from bytesplat_ns.input_checks import check_transforms_json


@dataclass
class ByteSplatDataParserConfig(NerfstudioDataParserConfig):
    """nerfstudio-data with the sparse point cloud loaded (splat initialisation) through plyfile."""

    _target: type = field(default_factory=lambda: ByteSplatDataParser)
    load_3D_points: bool = True
    """Whether to load the 3D points from the PLY named by transforms.json's ply_file_path."""


class ByteSplatDataParser(Nerfstudio):
    config: ByteSplatDataParserConfig

    def _generate_dataparser_outputs(self, split: str = "train", **kwargs):
        check_transforms_json(self.config.data)  # a clear message instead of a traceback deep in the parser
        return super()._generate_dataparser_outputs(split, **kwargs)

    def _load_3D_points(
        self, ply_file_path: Path, transform_matrix: torch.Tensor, scale_factor: float
    ) -> dict[str, torch.Tensor] | None:
        vertices = PlyData.read(str(ply_file_path))["vertex"]
        if vertices.count == 0:
            return None
        xyz = torch.from_numpy(np.stack([vertices[a] for a in "xyz"], axis=-1).astype(np.float32))  # [P, 3]
        xyz = torch.cat([xyz, torch.ones_like(xyz[:, :1])], dim=-1) @ transform_matrix.T * scale_factor
        names = set(vertices.data.dtype.names)
        if {"red", "green", "blue"} <= names:
            rgb = np.stack([vertices[c] for c in ("red", "green", "blue")], axis=-1)
            if rgb.dtype.kind == "f":  # float colours in [0, 1]
                rgb = np.clip(rgb * 255.0 + 0.5, 0, 255)
            rgb = torch.from_numpy(rgb.astype(np.uint8))  # [P, 3]
        else:
            rgb = torch.zeros((0, 3), dtype=torch.uint8)  # as nerfstudio: no colours, random initial colour
        return {"points3D_xyz": xyz, "points3D_rgb": rgb}


bytesplat_data = DataParserSpecification(
    config=ByteSplatDataParserConfig(),
    description="nerfstudio-data scenes with the point cloud read without open3d",
)
