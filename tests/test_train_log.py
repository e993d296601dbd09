"""The logged training values are read late: floats at log steps, the values of the step `late` steps before."""

from __future__ import annotations

import pytest
import torch

from bytesplat_ns.train_log import LateLogValues


def _step(step: int):
    loss = torch.tensor(float(step))
    return loss, {"main_loss": loss * 2, "scale_reg": torch.tensor(0.5)}, {"psnr": loss + 20, "gaussian_count": 7}


@pytest.mark.parametrize("every, late, want_late", [(10, 1, 1), (10, 4, 4), (2, 4, 2)])
def test_log_steps_get_an_earlier_steps_values_as_floats(every, late, want_late):
    log = LateLogValues(steps_per_log=every, steps_late=late)
    assert log.late == want_late  # never further back than the previous log step
    seen = {}
    for step in range(31):
        seen[step] = log(step, *_step(step))
    assert torch.is_tensor(seen[0][0])  # the first log: read as it is
    assert torch.is_tensor(seen[5][0]) and torch.is_tensor(seen[9][1]["main_loss"])  # not logged: untouched
    for step in range(every, 31, every):
        loss, losses, metrics = seen[step]
        logged = step - want_late
        assert loss == logged and isinstance(loss, float)
        assert losses == {"main_loss": 2.0 * logged, "scale_reg": 0.5}
        assert metrics == {"psnr": 20.0 + logged, "gaussian_count": 7}


def test_logging_off_leaves_everything_as_is():
    log = LateLogValues(steps_per_log=0)
    out = log(10, *_step(10))
    assert torch.is_tensor(out[0]) and out[2]["gaussian_count"] == 7
