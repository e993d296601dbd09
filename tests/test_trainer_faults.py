"""Faults during training: non-finite steps, out of memory while densifying, SIGTERM, interrupted writes."""

from __future__ import annotations

import math
import signal
import subprocess
import time

import pytest
import torch

from bytesplat_ns.demo import ns_tool
from bytesplat_ns.model import ByteSplatModel
from bytesplat_ns.strategy import ByteSplatStrategy
from tests.trainer_setup import make_trainer, small_scene

NAN_STEP = 15


def test_nonfinite_step_is_skipped_and_state_restored(tmp_path, monkeypatch):
    original = ByteSplatModel.get_loss_dict

    def poisoned(self, outputs, batch, metrics_dict=None):
        losses = original(self, outputs, batch, metrics_dict)
        if self.step == NAN_STEP:
            losses["main_loss"] = losses["main_loss"] * math.nan
        return losses

    monkeypatch.setattr(ByteSplatModel, "get_loss_dict", poisoned)
    trainer = make_trainer(tmp_path, steps=30)
    trainer.train()
    assert len(trainer.guard.events) == 1
    assert (
        f"step {NAN_STEP}" in trainer.guard.events[0]
        and "restored the state from before step 10" in trainer.guard.events[0]
    )
    for param in trainer.pipeline.model.gauss_params.values():
        assert torch.isfinite(param).all()
    assert (trainer.checkpoint_dir / f"step-{29:09d}.ckpt").exists()


def test_out_of_memory_while_densifying_saves_and_names_the_cap(tmp_path, monkeypatch, capsys):
    def out_of_memory(self, params, optimizers, state, step, info, packed=False):
        if step == 12:
            raise torch.OutOfMemoryError("CUDA out of memory (simulated)")

    monkeypatch.setattr(ByteSplatStrategy, "step_post_backward", out_of_memory)
    trainer = make_trainer(tmp_path, steps=30, warmup_length=5, refine_every=6)  # step 12 refines
    with pytest.raises(SystemExit) as exit_info:
        trainer.train()
    assert exit_info.value.code == 2
    printed = capsys.readouterr().out
    assert "Out of GPU memory while densifying at step 12" in printed and "--pipeline.model.max-splats" in printed
    assert (trainer.checkpoint_dir / f"step-{12:09d}.ckpt").exists()


def test_max_splats_caps_densification(tmp_path):
    cap = 200
    trainer = make_trainer(tmp_path, steps=40, warmup_length=5, refine_every=10, max_splats=cap)
    trainer.train()
    assert trainer.pipeline.model.num_points <= cap


def test_interrupted_checkpoint_write_keeps_the_good_one(tmp_path, monkeypatch):
    trainer = make_trainer(tmp_path, steps=1)
    trainer.save_checkpoint(5)
    good = trainer.checkpoint_dir / f"step-{5:09d}.ckpt"
    good_bytes = good.read_bytes()

    def dies_midway(obj, f, *args, **kwargs):
        f.write(b"partial")
        raise OSError("disk full (simulated)")

    monkeypatch.setattr(torch, "save", dies_midway)
    with pytest.raises(OSError):
        trainer.save_checkpoint(6)
    assert good.read_bytes() == good_bytes
    assert not (trainer.checkpoint_dir / f"step-{6:09d}.ckpt").exists()


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_sigterm_or_ctrl_c_writes_a_final_checkpoint(tmp_path, signum):
    scene = small_scene(tmp_path)
    out = tmp_path / "out"
    proc = subprocess.Popen(
        [ns_tool("ns-train"), "bytesplat", "--data", str(scene), "--machine.device-type", "cpu",
         "--max-num-iterations", "100000", "--output-dir", str(out), "--experiment-name", "term",
         "--timestamp", "run", "--vis", "tensorboard", "--pipeline.model.num-downscales", "0"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    lines = []
    deadline = time.monotonic() + 240
    for line in proc.stdout:
        lines.append(line)
        if "Step (% Done)" in line or time.monotonic() > deadline:
            break
    time.sleep(3)  # a few steps in
    proc.send_signal(signum)
    rest, _ = proc.communicate(timeout=120)
    printed = "".join(lines) + rest
    assert proc.returncode == 0, printed[-3000:]
    assert f"{signal.Signals(signum).name}: stopping after this step" in printed and "bytesplat summary" in printed
    checkpoints = list((out / "term" / "bytesplat" / "run" / "nerfstudio_models").iterdir())
    assert len(checkpoints) == 1 and checkpoints[0].suffix == ".ckpt", checkpoints
    assert torch.load(checkpoints[0], map_location="cpu")["step"] < 100000


def test_guard_flags_a_nonfinite_gradient_and_zeroes_that_steps_gradients():
    from bytesplat_ns.finite_guard import NonFiniteGuard

    params = [torch.nn.Parameter(torch.zeros(5, w)) for w in (3, 1)]
    optimizers = {"a": torch.optim.Adam(params[:1]), "b": torch.optim.Adam(params[1:])}
    guard = NonFiniteGuard(check_every=10)
    for p in params:
        p.grad = torch.ones_like(p)
    guard.after_backward(3, torch.tensor(0.5), optimizers)  # a good step: untouched
    assert not bool(guard.bad) and all(bool((p.grad == 1).all()) for p in params)
    params[1].grad[2, 0] = math.inf  # a finite loss, one gradient value not
    guard.after_backward(4, torch.tensor(0.5), optimizers)
    assert bool(guard.bad) and int(guard.first_bad_step) == 4
    assert all(bool((p.grad == 0).all()) for p in params)  # that step's update becomes nil
    for p in params:
        p.grad = torch.ones_like(p)
    guard.after_backward(5, torch.tensor(0.5), optimizers)  # later good steps: the first bad step is kept
    assert int(guard.first_bad_step) == 4 and bool((params[0].grad == 1).all())


def test_guard_returns_the_steps_flag_for_an_optimizer_that_skips_on_it():
    """zero_bad_grads=False (the one-launch Adam reads the flag): the gradients stay as they are."""
    from bytesplat_ns.finite_guard import NonFiniteGuard

    param = torch.nn.Parameter(torch.zeros(4, 3))
    optimizers = {"a": torch.optim.Adam([param])}
    guard = NonFiniteGuard(check_every=10)
    param.grad = torch.ones_like(param)
    assert not bool(guard.after_backward(1, torch.tensor(0.5), optimizers, zero_bad_grads=False))
    param.grad[1, 2] = math.nan
    bad = guard.after_backward(2, torch.tensor(0.5), optimizers, zero_bad_grads=False)
    assert bool(bad) and bool(guard.bad) and int(guard.first_bad_step) == 2
    assert int((param.grad == 1).sum()) == 11  # untouched
    param.grad = torch.ones_like(param)
    assert not bool(guard.after_backward(3, torch.tensor(0.5), optimizers, zero_bad_grads=False))  # this step's


def test_guard_refreshes_its_snapshot_in_place_until_a_shape_changes():
    """One snapshot at a time: the same tensors are overwritten while shapes hold, and a restore brings back the
    values of the last check."""
    from bytesplat_ns.finite_guard import NonFiniteGuard

    params = [torch.nn.Parameter(torch.zeros(5, w)) for w in (3, 1)]
    optimizers = {"a": torch.optim.Adam(params[:1]), "b": torch.optim.Adam(params[1:])}

    def adam_step(value: float) -> None:
        for p in params:
            p.grad = torch.full_like(p, value)
        for opt in optimizers.values():
            opt.step()

    guard = NonFiniteGuard(check_every=10)
    adam_step(1.0)
    guard.check(10, optimizers, {})
    first = guard.snapshot
    saved = [t.data_ptr() for ts in first.params.values() for t in ts]
    adam_step(2.0)
    expected = [p.detach().clone() for p in params]
    expected_moments = [optimizers[n].state[p]["exp_avg_sq"].clone() for n, p in zip("ab", params)]
    guard.check(20, optimizers, {})
    assert guard.snapshot is first and first.step == 20
    assert [t.data_ptr() for ts in first.params.values() for t in ts] == saved
    assert all(torch.equal(s, e) for s, e in zip([*first.params["a"], *first.params["b"]], expected))

    adam_step(3.0)  # a bad step later: back to step 20's state
    params[0].grad[0, 0] = math.nan
    guard.after_backward(25, torch.tensor(0.5), optimizers)
    assert guard.check(30, optimizers, {"grad2d": 1, "count": 1, "radii": 1})
    assert all(torch.equal(p, e) for p, e in zip(params, expected))
    moments = [optimizers[n].state[p]["exp_avg_sq"] for n, p in zip("ab", params)]
    assert all(torch.equal(m, e) for m, e in zip(moments, expected_moments))

    grown = torch.nn.Parameter(torch.zeros(7, 3))  # a refine changed a shape: a new snapshot
    optimizers["a"].param_groups[0]["params"] = [grown]
    optimizers["a"].state.clear()
    guard.check(40, optimizers, {})
    assert guard.snapshot is not first and guard.snapshot.params["a"][0].shape == (7, 3)
