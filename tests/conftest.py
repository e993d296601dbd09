import os

os.environ.setdefault("MPLBACKEND", "Agg")


def pytest_collection_modifyitems(config, items):
    """Tests marked `two_gpus` (pyproject.toml) skip on a machine with fewer than two CUDA GPUs."""
    import pytest
    import torch

    if torch.cuda.device_count() >= 2:
        return
    skip = pytest.mark.skip(reason="needs 2 CUDA GPUs (NCCL): run on the two-GPU machine with -m two_gpus")
    for item in items:
        if "two_gpus" in item.keywords:
            item.add_marker(skip)
