"""`ns-train bytesplat` is registered, refuses more GPUs than present cleanly, and its optimizers match the model."""

from __future__ import annotations

import copy

import torch
from nerfstudio.data.scene_box import SceneBox

from bytesplat_method_configs import bytesplat
from bytesplat_ns.model import ByteSplatModel
from tests.nerfstudio_cli import ns


def test_ns_train_help_lists_bytesplat_options():
    proc = ns("ns-train", "bytesplat", "--help")
    assert "--pipeline.model.renderer" in proc.stdout
    assert bytesplat.config.method_name == "bytesplat"


def test_multi_gpu_request_exits_at_once_with_a_message():
    proc = ns("ns-train", "bytesplat", "--machine.num-devices", "2", "--data", "/nonexistent", check=False, timeout=120)
    assert proc.returncode == 2
    assert "more GPUs than this machine has" in proc.stdout
    assert "Traceback" not in proc.stderr


def test_optimizer_keys_equal_model_param_groups():
    config = copy.deepcopy(bytesplat.config)
    model_config = config.pipeline.model
    model_config.camera_optimizer.mode = "SO3xR3"  # every optional param group on
    model_config.use_bilateral_grid = True
    points = torch.rand(50, 3), torch.randint(0, 255, (50, 3))
    box = SceneBox(torch.tensor([[-1.0] * 3, [1.0] * 3]))
    model = model_config.setup(scene_box=box, num_train_data=4, seed_points=points)
    assert isinstance(model, ByteSplatModel)
    assert set(model.get_param_groups()) == set(config.optimizers)
