"""Let nerfstudio's checkpoints load under torch >= 2.6, where torch.load defaults to weights_only=True.

Nerfstudio stores learning rates and scheduler state as numpy scalars; allow-listing exactly those
types keeps weights_only loading safe and makes ns-eval, ns-render, ns-viewer and --load-dir work.
"""

from __future__ import annotations

import importlib

import numpy as np
import torch


def allow_numpy_scalars_in_checkpoints() -> None:
    numpy2 = int(np.__version__.split(".")[0]) >= 2  # numpy 2 renamed numpy.core to numpy._core
    multiarray = importlib.import_module("numpy._core.multiarray" if numpy2 else "numpy.core.multiarray")
    dtype_classes = [type(np.dtype(t)) for t in (np.float64, np.float32, np.int64, np.int32, np.bool_)]
    torch.serialization.add_safe_globals(
        [multiarray.scalar, multiarray._reconstruct, np.ndarray, np.dtype, *dtype_classes]
    )
