"""The logged training values are read late: floats at log steps, the values of the step `late` steps before."""

from __future__ import annotations

import nerfstudio.configs.base_config  # noqa: F401  (before nerfstudio.utils.writer: they import each other)
import pytest
import torch
from nerfstudio.utils import writer
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

from bytesplat_ns.train_log import (
    PER_STEP_TIMES,
    ConsoleEvery,
    LateLogValues,
    LogStepWriter,
    flush_log_writers,
    log_timing_at_log_steps,
)


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


class _Recorder(writer.Writer):
    def __init__(self) -> None:
        self.scalars: list[tuple[str, int]] = []

    def write_scalar(self, name: str, scalar, step: int) -> None:
        self.scalars.append((name, step))


def test_timing_scalars_and_learning_rates_reach_the_event_writers_at_log_steps_only(monkeypatch):
    recorder = _Recorder()
    monkeypatch.setattr(writer, "EVENT_WRITERS", [recorder])
    monkeypatch.setattr(writer, "EVENT_STORAGE", [])
    monkeypatch.setattr(writer, "GLOBAL_BUFFER", {"max_buffer_size": 20, "max_iter": 100, "events": {}})
    log_timing_at_log_steps(steps_per_log=10)
    log_timing_at_log_steps(steps_per_log=10)  # a second trainer in the process: wrapped once
    assert isinstance(writer.EVENT_WRITERS[0], LogStepWriter) and writer.EVENT_WRITERS[0].inner is recorder
    for step in range(25):  # what nerfstudio's training loop does each step
        writer.put_time(writer.EventName.ITER_TRAIN_TIME, 0.001, step=step, update_eta=True)
        writer.put_time(writer.EventName.TRAIN_RAYS_PER_SEC, 1e6, step=step)
        writer.put_scalar("learning_rate/means", 1e-4, step=step)
        if step % 10 == 0:
            writer.put_scalar("Train Loss", 0.5, step=step)
        writer.put_scalar("Test PSNR", 30.0, step=step)  # any other scalar: every time it is put
        writer.write_out_storage()
    by_name = {name: [s for n, s in recorder.scalars if n == name] for name, _ in recorder.scalars}
    for name in [*PER_STEP_TIMES, "learning_rate/means"]:
        assert by_name[name] == [0, 10, 20], name
    assert by_name["Train Loss"] == [0, 10, 20]
    assert by_name["Test PSNR"] == list(range(25))
    assert len(writer.GLOBAL_BUFFER["events"]["Train Iter (time)"]["buffer"]) == 20  # the console's averages: all


def test_the_console_prints_a_log_step_only_when_its_last_line_is_old_enough(monkeypatch):
    clock = iter([0.0, 0.05, 0.12, 0.15])  # the log steps' times
    monkeypatch.setattr("bytesplat_ns.train_log.time.perf_counter", lambda: next(clock))
    printed = []
    console = ConsoleEvery(printed.append, steps_per_log=10, every_s=0.1)
    for step in range(40):
        console(step)
    assert printed == [0, *range(1, 10), *range(11, 20), 20, *range(21, 30), *range(31, 40)]  # 10, 30: too soon


def test_the_console_writer_is_throttled_once(monkeypatch):
    local = writer.LocalWriter.__new__(writer.LocalWriter)  # no terminal set-up
    local.write_stats_log = lambda step: None
    monkeypatch.setattr(writer, "EVENT_WRITERS", [local])
    log_timing_at_log_steps(steps_per_log=10)
    log_timing_at_log_steps(steps_per_log=10)
    assert isinstance(local.write_stats_log, ConsoleEvery) and not isinstance(local.write_stats_log.inner, ConsoleEvery)
    assert writer.EVENT_WRITERS == [local]


def _tensorboard_scalars(folder) -> dict[str, list[tuple[int, float]]]:
    events = EventAccumulator(str(folder), size_guidance={"scalars": 0})
    events.Reload()
    return {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


def test_tensorboard_gets_each_steps_scalars_as_nerfstudio_writes_them(monkeypatch, tmp_path):
    """A step's scalars go out as one event: tensorboard reads the same tags, steps and values as from nerfstudio's
    own writer (one event per scalar)."""

    def log(tensorboard: writer.TensorboardWriter, wrap: bool) -> None:
        monkeypatch.setattr(writer, "EVENT_WRITERS", [tensorboard])
        monkeypatch.setattr(writer, "EVENT_STORAGE", [])
        monkeypatch.setattr(writer, "GLOBAL_BUFFER", {"max_buffer_size": 20, "max_iter": 100, "events": {}})
        if wrap:
            log_timing_at_log_steps(steps_per_log=10)
        for step in range(31):  # as nerfstudio's training loop, our trainer flushing at each step's start
            flush_log_writers()
            if step % 10 == 0:
                writer.put_scalar("Train Loss", 0.5 + step, step=step)
                writer.put_dict("Train Metrics Dict", {"psnr": 20.0 + step, "gaussian_count": 7 * step}, step=step)
                writer.put_time(writer.EventName.ITER_TRAIN_TIME, 0.001, step=step, update_eta=True)
            writer.put_scalar("Test PSNR", 30.0 + step, step=step)
            writer.write_out_storage()
        flush_log_writers()  # the end of training
        tensorboard.tb_writer.close()

    tensorboard = writer.TensorboardWriter(log_dir=tmp_path / "plain")
    log(tensorboard, wrap=False)
    tensorboard = writer.TensorboardWriter(log_dir=tmp_path / "held")
    log(tensorboard, wrap=True)
    plain, held = _tensorboard_scalars(tmp_path / "plain"), _tensorboard_scalars(tmp_path / "held")
    assert held == plain
    values_per_event = [len(e.summary.value) for e in EventFileLoader(str(next((tmp_path / "held").iterdir()))).Load()]
    assert max(values_per_event) == 6  # a log step's six scalars in one event
    assert held["Train Metrics Dict/gaussian_count"] == [(0, 0.0), (10, 70.0), (20, 140.0), (30, 210.0)]
    assert [s for s, _ in held["Test PSNR"]] == list(range(31))
