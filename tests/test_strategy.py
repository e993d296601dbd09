"""ByteSplatStrategy: the sync-free statistics update equals gsplat's, and refines draw seeded randomness."""

from __future__ import annotations

import copy

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
