"""ByteSplatStrategy: the sync-free statistics update equals gsplat's, and refines draw seeded randomness."""

from __future__ import annotations

import copy
from unittest import mock

import pytest
import torch
from gsplat.strategy import DefaultStrategy
from nerfstudio.engine.callbacks import TrainingCallback, TrainingCallbackLocation

from bytesplat_ns.strategy import ByteSplatStrategy

N = 500


def random_info(generator: torch.Generator) -> dict:
    means2d = torch.randn(1, N, 2, generator=generator).requires_grad_()
    means2d.grad = torch.randn(1, N, 2, generator=generator)
    means2d.absgrad = means2d.grad.abs() * 1.5
    radii = torch.randint(0, 4, (1, N), dtype=torch.int32, generator=generator)
    return {"means2d": means2d, "radii": radii, "width": 64, "height": 48, "n_cameras": 1, "gaussian_ids": None}


@pytest.mark.parametrize("absgrad", [True, False])
def test_statistics_update_equals_gsplats_bit_for_bit(absgrad):
    params = {"means": torch.nn.Parameter(torch.randn(N, 3))}
    ours, theirs = (cls(absgrad=absgrad, refine_scale2d_stop_iter=10) for cls in (ByteSplatStrategy, DefaultStrategy))
    state_ours, state_theirs = ours.initialize_state(), theirs.initialize_state()
    generator = torch.Generator().manual_seed(0)
    for _ in range(3):
        info = random_info(generator)
        ours.accumulate(params, state_ours, info, step=0)
        theirs._update_state(params, state_theirs, info)
    for key in ("grad2d", "count", "radii"):
        assert torch.equal(state_ours[key], state_theirs[key]), key


def test_refine_draws_depend_on_seed_and_step_only():
    """Two strategies with different RNG histories split the same splats to the same places."""
    generator = torch.Generator().manual_seed(1)
    params = {
        "means": torch.randn(N, 3, generator=generator),
        "scales": torch.randn(N, 3, generator=generator) - 1.0,
        "quats": torch.randn(N, 4, generator=generator),
        "opacities": torch.randn(N, generator=generator),
    }
    params = torch.nn.ParameterDict({k: torch.nn.Parameter(v) for k, v in params.items()})
    strategy = ByteSplatStrategy(seed=7, grow_grad2d=0.0, grow_scale3d=-1.0, verbose=False)  # split everything
    results = []
    for noise in range(2):
        torch.manual_seed(100 + noise)  # a different history before the refine
        ps = copy.deepcopy(params)
        optimizers = {k: torch.optim.Adam([p], lr=1e-3) for k, p in ps.items()}
        state = strategy.initialize_state()
        state.update(grad2d=torch.ones(N), count=torch.ones(N), radii=torch.ones(N))
        strategy._grow_gs(ps, optimizers, state, step=600)
        results.append(ps["means"].detach().clone())
    assert results[0].shape[0] > N
    assert torch.equal(results[0], results[1])


def test_a_training_step_adds_its_statistics_once(tmp_path):
    """The statistics come in with the step (strategy.accumulate, right after backward); the after-iteration
    callback only refines: each step counts a splat it sees once, and adds what gsplat's update would."""
    from tests.trainer_setup import make_trainer

    trainer = make_trainer(tmp_path, steps=3, warmup_length=1000)
    model = trainer.pipeline.model
    reference = DefaultStrategy(absgrad=model.strategy.absgrad, refine_scale2d_stop_iter=0)
    expected = reference.initialize_state()
    seen = []

    def update_reference(step: int) -> None:
        params = {"means": model.gauss_params["means"]}
        reference._update_state(params, expected, model.info)
        seen.append(model.info["radii"] > 0)

    trainer.callbacks.append(TrainingCallback([TrainingCallbackLocation.AFTER_TRAIN_ITERATION], update_reference))
    addresses = []  # the step graph bakes the statistics' tensors in: they must be updated in place
    trainer.callbacks.append(
        TrainingCallback(
            [TrainingCallbackLocation.AFTER_TRAIN_ITERATION],
            lambda step: addresses.append([model.strategy_state[k].data_ptr() for k in ("grad2d", "count", "radii")]),
        )
    )
    trainer.train()
    assert model.strategy.refine_scale2d_stop_iter > 0  # the screen radii are tracked too
    assert addresses[0] == addresses[-1]
    state = model.strategy_state
    assert torch.equal(state["count"], torch.stack(seen).sum(dim=0).reshape(-1).float())
    assert state["count"].max() == 3
    torch.testing.assert_close(state["grad2d"], expected["grad2d"])


def splats_with_adam(start: dict) -> tuple[torch.nn.ParameterDict, dict]:
    """(parameters copied from `start`, an Adam per parameter that has stepped once: its moments exist, as in
    training)."""
    params = torch.nn.ParameterDict({k: torch.nn.Parameter(v.clone()) for k, v in start.items()})
    optimizers = {k: torch.optim.Adam([p], lr=1e-3) for k, p in params.items()}
    for p in params.values():
        p.grad = torch.ones_like(p)
    for optimizer in optimizers.values():
        optimizer.step()
    return params, optimizers


class _GsplatRefines(DefaultStrategy):
    """gsplat's DefaultStrategy with the statistics given, as ByteSplatStrategy's come in with the step."""

    def _update_state(self, params, state, info, packed=False):
        pass


def test_refines_and_resets_as_gsplat_without_emptying_the_cache():
    """Over refine and opacity-reset steps, step_post_backward leaves the splats, Adam's state and the statistics as
    gsplat's DefaultStrategy does (its draws seeded alike), and never empties the allocator's cache."""
    options = dict(refine_start_iter=1, refine_every=2, reset_every=6, pause_refine_after_reset=0,
                   refine_stop_iter=100, refine_scale2d_stop_iter=100, grow_grad2d=0.5, grow_scale3d=0.05,
                   prune_opa=0.2, verbose=False)  # fmt: skip
    ours, theirs = ByteSplatStrategy(seed=3, **options), _GsplatRefines(**options)
    generator = torch.Generator().manual_seed(2)
    start = {
        "means": torch.randn(N, 3, generator=generator),
        "scales": torch.randn(N, 3, generator=generator) * 0.5 - 3.0,
        "quats": torch.randn(N, 4, generator=generator),
        "opacities": torch.randn(N, generator=generator),
    }
    runs = [(*splats_with_adam(start), ours.initialize_state()) for _ in range(2)]
    with mock.patch.object(torch.cuda, "empty_cache") as empty_cache:
        for step in range(1, 13):
            n = len(runs[0][0]["means"])
            statistics = {"grad2d": torch.rand(n, generator=generator), "count": torch.ones(n),
                          "radii": torch.rand(n, generator=generator) * 0.2}  # fmt: skip
            emptied = []
            for (params, optimizers, state), strategy in zip(runs, (ours, theirs)):
                state.update({k: v.clone() for k, v in statistics.items()})
                torch.manual_seed(3 * 1_000_003 + step)  # ByteSplatStrategy's seed for this step's draws
                calls = empty_cache.call_count
                strategy.step_post_backward(params, optimizers, state, step, info={})
                emptied.append(empty_cache.call_count - calls)
            assert emptied == [0, int(step % 2 == 0)], step  # gsplat's refines (even steps) empty it; ours never
            (p_ours, o_ours, s_ours), (p_theirs, o_theirs, s_theirs) = runs
            for name in p_ours:
                assert torch.equal(p_ours[name], p_theirs[name]), (step, name)
                for moment in ("exp_avg", "exp_avg_sq"):
                    mine, reference = (o[name].state[o[name].param_groups[0]["params"][0]] for o in (o_ours, o_theirs))
                    assert torch.equal(mine[moment], reference[moment]), (step, name, moment)
            for key in statistics:
                assert torch.equal(s_ours[key], s_theirs[key]), (step, key)
        assert len(runs[0][0]["means"]) != N  # the refines grew or pruned splats
