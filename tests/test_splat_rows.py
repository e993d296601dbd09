"""Splat rows held at a capacity on rungs (splat_rows.py): refines on them give gsplat's result on the live rows and
keep the tensors while the count keeps its rung; inert rows render nothing and take no gradient; a run with rows
held trains as one without, and writes checkpoints of the live splats only."""

from __future__ import annotations

import random

import numpy
import torch

from bytesplat_ns.capacity_rungs import rung_above
from bytesplat_ns.splat_rows import INERT, SplatRows, fill_inert
from bytesplat_ns.strategy import ByteSplatStrategy
from tests.test_strategy import splats_with_adam
from tests.trainer_setup import make_trainer

N = 500
GRANULE = 64
STATISTICS = ("grad2d", "count", "radii")


def _splats(start: dict, rows: SplatRows | None):
    params, optimizers = splats_with_adam(start)
    state = ByteSplatStrategy().initialize_state()
    if rows is not None:
        rows.hold(params, optimizers, state)
    return params, optimizers, state


def _moments(optimizer: torch.optim.Optimizer) -> dict:
    return optimizer.state[optimizer.param_groups[0]["params"][0]]


def test_refines_on_held_rows_equal_refines_on_the_live_splats():
    """Step by step over refines and opacity resets: the held run's leading rows, moments and statistics equal the
    plain run's bit for bit, the rows past them are inert with zero moments and statistics, and the tensors stay the
    same objects at the same addresses exactly while the count keeps its rung."""
    options = dict(refine_start_iter=1, refine_every=2, reset_every=6, pause_refine_after_reset=0,
                   refine_stop_iter=100, refine_scale2d_stop_iter=100, grow_grad2d=0.95, grow_scale3d=0.05,
                   prune_opa=0.02, verbose=False)  # fmt: skip
    strategy = ByteSplatStrategy(seed=3, **options)
    generator = torch.Generator().manual_seed(2)
    start = {
        "means": torch.randn(N, 3, generator=generator),
        "scales": torch.randn(N, 3, generator=generator) * 0.5 - 3.0,
        "quats": torch.randn(N, 4, generator=generator),
        "opacities": torch.randn(N, 1, generator=generator),
    }
    rows = SplatRows(live=N, granule=GRANULE)
    plain, held = _splats(start, None), _splats(start, rows)
    kept = changed = 0
    for step in range(1, 25):
        n = len(plain[0]["means"])
        statistics = {"grad2d": torch.rand(n, generator=generator), "count": torch.ones(n),
                      "radii": torch.rand(n, generator=generator) * 0.2}  # fmt: skip
        plain[2].update({k: v.clone() for k, v in statistics.items()})
        capacity = rows.capacity
        held[2].update({k: torch.cat([v, v.new_zeros(capacity - n)]) for k, v in statistics.items()})
        before = {name: (p, p.data_ptr()) for name, p in held[0].items()}
        strategy.step_post_backward(*plain, step, info={})
        with_live = rows.release(*held)
        strategy.step_post_backward(*held, step, info={})
        rows.hold(*held, with_live)

        live = len(plain[0]["means"])
        assert rows.live == live and rows.capacity == rung_above(live, GRANULE), step
        for name, param in held[0].items():
            assert param.shape[0] == rows.capacity, (step, name)
            assert torch.equal(param[:live], plain[0][name]), (step, name)
            inert = torch.empty_like(param[live:])
            fill_inert(name, inert)
            assert torch.equal(param[live:], inert), (step, name)
            mine, reference = _moments(held[1][name]), _moments(plain[1][name])
            assert mine["step"] is _moments(held[1][name])["step"]
            for moment in ("exp_avg", "exp_avg_sq"):
                assert torch.equal(mine[moment][:live], reference[moment]), (step, name, moment)
                assert not mine[moment][live:].any(), (step, name, moment)
            same = param is before[name][0] and param.data_ptr() == before[name][1]
            assert same == (rows.capacity == capacity), (step, name)
            assert held[1][name].param_groups[0]["params"][0] is param
        for key in STATISTICS:
            assert torch.equal(held[2][key][:live], plain[2][key]), (step, key)
            assert not held[2][key][live:].any(), (step, key)
        kept += rows.capacity == capacity
        changed += rows.capacity != capacity
    assert kept >= 3 and changed >= 1, (kept, changed)  # both cases were met
    opacities = held[0]["opacities"].detach()
    live = rows.live
    rows.live = -1
    rows.recount(opacities)
    assert rows.live == live


def test_inert_rows_render_nothing_and_take_no_gradient(tmp_path):
    """The reference renderer: held rows render the image the live splats render; a training render culls every
    inert row (radius 0) and leaves its gradient zero."""
    trainer = make_trainer(tmp_path, 1)
    model = trainer.pipeline.model
    camera, batch = trainer.pipeline.datamanager.next_train(0)
    model.eval()
    with torch.no_grad():
        live_image = model.get_outputs(camera.to(model.device))["rgb"]
    live = model.num_points
    model.hold_rows(trainer.optimizers.optimizers)
    assert model.num_rows > live and model.num_points == live
    with torch.no_grad():
        torch.testing.assert_close(model.get_outputs(camera.to(model.device))["rgb"], live_image, rtol=0, atol=1e-6)
    model.train()
    outputs = model.get_outputs(camera, batch=batch)
    loss = sum(model.get_loss_dict(outputs, batch).values())
    loss.backward()
    assert not model.info["radii"].reshape(-1)[live:].any()
    assert model.info["radii"].reshape(-1)[:live].any()
    for name, param in model.gauss_params.items():
        assert not param.grad[live:].any(), name
        assert param.grad[:live].any() or name == "features_rest", name  # SH degree 0 at step 0
    assert (model.opacities[live:] == INERT["opacities"]).all()


def test_a_run_with_held_rows_trains_as_one_without(tmp_path):
    """On the CPU (where the trainer holds no rows by itself): the same run with rows held from the start ends with
    the same splats, still held at the rung of their count, and its checkpoints hold the live splats only."""
    options = dict(warmup_length=10, refine_every=10, densify_grad_thresh=1e-6)
    runs = []
    for hold in (False, True):
        torch.manual_seed(0)  # the random background and the camera order (nerfstudio's ns-train seeds them)
        random.seed(0)
        numpy.random.seed(0)
        trainer = make_trainer(tmp_path / str(hold), 45, **options)
        trainer.config.steps_per_save = 30
        model = trainer.pipeline.model
        start = model.num_points
        if hold:
            model.hold_rows(trainer.optimizers.optimizers)
            assert model.num_rows > start
        trainer.train()
        assert model.num_rows == (rung_above(model.num_points, model.rows.granule) if hold else model.num_points)
        checkpoint = torch.load(sorted(trainer.checkpoint_dir.glob("*.ckpt"))[-1], weights_only=False)
        saved = checkpoint["pipeline"]
        assert saved["_model.gauss_params.means"].shape[0] == model.num_points
        for optimizer in checkpoint["optimizers"].values():
            for moments in optimizer["state"].values():
                assert moments["exp_avg"].shape[0] == model.num_points
        runs.append(model)
    plain, held = runs
    assert plain.num_points == held.num_points > start  # the refines grew the splats alike
    for name, param in plain.gauss_params.items():  # the same up to float sums in another order
        live = held.gauss_params[name][: held.num_points]
        assert float((live - param).norm()) <= 1e-4 * float(param.norm()), name
