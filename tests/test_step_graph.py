"""The training step recorded as a CUDA graph and replayed (step_graph.py) trains as the eager step does, is
recorded again when densification changes the splats, and keeps the non-finite guard working."""

from __future__ import annotations

import gc

import pytest
import torch
from nerfstudio.engine.callbacks import TrainingCallback, TrainingCallbackLocation

from tests.trainer_setup import cpu_config, make_trainer, small_scene

gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA GPU")


def _gpu_trainer(root, steps: int, graph: bool, cache_images: str = "gpu", hold_splat_rows: bool = True,
                 **model_options):  # fmt: skip
    config = cpu_config(small_scene(root), root / "out", steps, f"graph_{graph}")
    config.hold_splat_rows = hold_splat_rows
    config.pipeline.datamanager.cache_images = cache_images
    config.machine.device_type = "cuda"
    config.cuda_graph = graph
    config.summary_eval = False
    config.pipeline.model.background_color = "white"  # random draws differ between replayed and eager steps
    for name, value in model_options.items():
        setattr(config.pipeline.model, name, value)
    trainer = config.setup(local_rank=0, world_size=1)
    trainer.setup()
    return trainer


def _relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def test_the_ground_truth_is_downscaled_as_splatfacto_does(tmp_path):
    """The box filter without cuDNN (model._downscale_if_required) gives splatfacto's resize_image."""
    from nerfstudio.models.splatfacto import resize_image

    model = make_trainer(tmp_path, steps=1, num_downscales=2, resolution_schedule=1000).pipeline.model
    model.step = 0  # downscale 4
    image = torch.rand(37, 42, 4, generator=torch.Generator().manual_seed(0))
    ours = model._downscale_if_required(image)
    assert ours.shape == (9, 10, 4)
    assert torch.allclose(ours, resize_image(image, 4), atol=1e-6)


def test_the_cpu_trains_op_by_op_and_says_why(tmp_path):
    trainer = make_trainer(tmp_path, steps=1)
    assert trainer.step_graph is None
    assert trainer.graph_off == "training on the CPU"


class _OpByOpRecorder:
    """Stands in for the step graph on the CPU: runs every step op by op, counts its releases."""

    captures = replays = 0
    record_seconds = 0.0
    eager: dict = {}
    recorded: dict = {}

    def __init__(self) -> None:
        self.releases = 0

    def run(self, step, camera, batch, note=None):
        return None

    def release(self) -> None:
        self.releases += 1


@pytest.mark.parametrize("ends", ["done", "failed"])
def test_training_frees_the_step_graph_when_it_ends(tmp_path, ends):
    """With several GPUs a recorded step holds NCCL's communicator, and destroying the process group waits until it
    is freed (StepGraph.release): the trainer frees it when training ends, normally or by an error."""
    trainer = make_trainer(tmp_path, steps=3)
    trainer.step_graph = recorder = _OpByOpRecorder()
    if ends == "failed":

        def fail(step: int) -> None:
            if step == 1:
                raise RuntimeError("a step failed")

        trainer.callbacks.append(TrainingCallback([TrainingCallbackLocation.AFTER_TRAIN_ITERATION], fail))
        with pytest.raises(RuntimeError, match="a step failed"):
            trainer.train()
    else:
        trainer.train()
    assert recorder.releases == 1


def test_several_gpus_replay_their_steps_unless_told_not_to(tmp_path):
    """Several GPUs replay their steps by default; --cuda-graph-several-gpus False runs them op by op, saying so."""
    from bytesplat_ns.step_graph import ineligible

    trainer = make_trainer(tmp_path, steps=1)
    trainer.device, trainer.world_size = "cuda:0", 2  # as rank 0 of two GPUs sees itself
    assert "--cuda-graph-several-gpus" not in (ineligible(trainer) or "")
    trainer.config.cuda_graph_several_gpus = False
    assert "--cuda-graph-several-gpus False" in ineligible(trainer)


def test_a_cuda_run_says_at_start_why_its_step_runs_op_by_op(tmp_path, capsys):
    trainer = make_trainer(tmp_path, steps=1)
    capsys.readouterr()
    trainer._say_why_op_by_op()  # on the CPU: nothing to say
    assert capsys.readouterr().out == ""
    trainer.device, trainer.graph_off = "cuda:0", "the camera optimizer is on"  # as a CUDA run with it would see
    trainer._say_why_op_by_op()
    said = " ".join(capsys.readouterr().out.split())
    assert "runs op by op" in said and "the camera optimizer is on" in said
    trainer.config.cuda_graph, trainer.graph_off = False, "--cuda-graph False"  # asked for: nothing to say
    trainer._say_why_op_by_op()
    assert capsys.readouterr().out == ""


def _state(trainer) -> list[torch.Tensor]:
    """Every parameter, Adam state and densification statistics tensor (the same tensor objects each call while
    nothing refines)."""
    tensors = []
    for optimizer in trainer.optimizers.optimizers.values():
        for param in (p for group in optimizer.param_groups for p in group["params"]):
            tensors += [param.data, *(v for v in optimizer.state[param].values() if torch.is_tensor(v))]
    strategy_state = trainer.pipeline.model.strategy_state
    return tensors + [strategy_state[name] for name in ("grad2d", "count") if strategy_state[name] is not None]


@gpu
def test_a_replayed_step_equals_the_eager_step(tmp_path):
    """From the same state and camera, one step replayed and the same step run op by op (twice: the fused
    kernel's atomic adds make op-by-op steps differ slightly from each other) give the same parameters, Adam
    state and densification statistics. SH degrees 0-3 are reached by step 9, so the view-dependent colours are
    in the graph too."""
    trainer = _gpu_trainer(tmp_path, 10, True, warmup_length=1000, sh_degree_interval=3)
    trainer.train()
    recorder = trainer.step_graph
    # op by op: step 0 (exact binning), 1 (step 0 made the Adam state), 3, 6, 9 (SH degrees 1, 2, 3); recorded at
    # 2, 4, 7
    assert (recorder.captures, recorder.replays) == (3, 5)
    camera, batch = trainer.pipeline.datamanager.next_train(11)
    trainer.pipeline.datamanager.next_train = lambda step: (camera, batch)
    before = [t.clone() for t in _state(trainer)]

    def step_from_before() -> list[torch.Tensor]:
        for tensor, saved in zip(_state(trainer), before):
            tensor.copy_(saved)
        trainer.train_iteration(11)  # not a log step: the loss comes back as a tensor
        return [t.clone() for t in _state(trainer)]

    replayed = step_from_before()
    assert (recorder.captures, recorder.replays) == (4, 6)
    trainer.step_graph = None
    eager, eager_again = step_from_before(), step_from_before()
    assert any(not torch.equal(a, b) for a, b in zip(eager, before))  # the step changed something
    for index, (graph, op, op_again) in enumerate(zip(replayed, eager, eager_again)):
        assert torch.isfinite(graph).all(), index
        assert _relative(graph, op) <= 1e-5 + 10 * _relative(op_again, op), index


@gpu
@pytest.mark.parametrize("cache_images", ["gpu", "cpu"])
def test_a_replay_renders_the_camera_it_is_given(tmp_path, cache_images):
    """A graph recorded on one camera, replayed on another, makes that other camera's step: the camera's matrices
    and image are read through the index the host writes before each replay (camera_matrices.py); with the
    images cached in host memory, the image is copied into the graph's buffer instead."""
    trainer = _gpu_trainer(tmp_path, 10, True, warmup_length=1000, cache_images=cache_images)
    trainer.train()
    recorder, datamanager = trainer.step_graph, trainer.pipeline.datamanager
    assert (datamanager.camera_stack.images is None) == (cache_images == "cpu")
    cameras = {}
    for step in range(len(datamanager.train_dataset)):
        camera, batch = datamanager.next_train(step)
        cameras[camera.metadata["cam_idx"]] = (camera, batch)
    (first, first_batch), (other, other_batch) = cameras[0], cameras[1]
    datamanager.next_train = lambda step: (first, first_batch)
    trainer.train_iteration(11)  # records (or replays) on the first camera
    captures = recorder.captures
    before = [t.clone() for t in _state(trainer)]

    def step_from_before() -> list[torch.Tensor]:
        for tensor, saved in zip(_state(trainer), before):
            tensor.copy_(saved)
        trainer.train_iteration(12)
        return [t.clone() for t in _state(trainer)]

    datamanager.next_train = lambda step: (other, other_batch)
    replayed = step_from_before()
    assert recorder.captures == captures  # replayed, not recorded on the other camera
    trainer.step_graph = None
    eager, eager_again = step_from_before(), step_from_before()
    for index, (graph, op, op_again) in enumerate(zip(replayed, eager, eager_again)):
        assert _relative(graph, op) <= 1e-5 + 10 * _relative(op_again, op), index
    datamanager.next_train = lambda step: (first, first_batch)
    on_first = step_from_before()  # the first camera's step differs: the camera matters to the result
    assert any(_relative(a, b) > 1e-3 for a, b in zip(on_first, eager))


@gpu
def test_the_sh_degree_rising_records_the_graph_again(tmp_path):
    trainer = _gpu_trainer(tmp_path, 40, True, warmup_length=1000, sh_degree_interval=15)
    trainer.train()
    recorder = trainer.step_graph
    assert recorder.eager == {"exact binning": 1, "new configuration": 3}, recorder.summary()  # steps 0, 1, 15, 30
    assert (recorder.captures, recorder.replays) == (3, 36)  # SH degrees 0, 1, 2
    assert recorder.graph is None  # released at the end of training (with NCCL, destroying the group waits on it)


@gpu
@pytest.mark.parametrize("hold", [False, True])
def test_densification_records_the_graph_again(tmp_path, hold):
    """Refines at steps 20, 30, 40, 50 grow the splats. The step after a refine that changed the splat tensors' rows
    bins exactly (eager), the one after records: with tensors of the live splats only, after every refine; with rows
    held at a capacity on rungs (splat_rows.py), only after a refine that moved the capacity to another rung."""
    trainer = _gpu_trainer(tmp_path, 60, True, hold_splat_rows=hold, warmup_length=10, refine_every=10,
                           densify_grad_thresh=1e-9)  # fmt: skip
    model, recorder = trainer.pipeline.model, trainer.step_graph
    start, rows = model.num_points, [model.num_rows]
    trainer.callbacks.append(TrainingCallback([TrainingCallbackLocation.AFTER_TRAIN_ITERATION],
                                              lambda step: rows.append(model.num_rows)))  # fmt: skip
    trainer.train()
    moves = sum(a != b for a, b in zip(rows, rows[1:]))
    assert model.num_points > start
    assert moves < 4 if hold else moves == 4
    # op by op: step 0 and the step after each move (exact binning), step 1 (step 0 made the Adam state)
    assert recorder.eager == {"exact binning": 1 + moves, "new configuration": 1}, recorder.summary()
    assert recorder.replays == 60 - 2 - moves
    assert recorder.captures >= 1 + moves  # and whenever the binning outgrew its recorded capacity
    assert all(torch.isfinite(p).all() for p in model.gauss_params.values())
    # every training camera's tile entries, read from its binning, replayed or eager (matched draws, datamanager.py)
    costs = model.bins.entries_by_view
    assert set(costs) == set(range(len(trainer.pipeline.datamanager.train_dataset))) and min(costs.values()) > 0


@gpu
def test_a_non_finite_replayed_step_is_caught_and_restored(tmp_path):
    trainer = _gpu_trainer(tmp_path, 30, True, warmup_length=1000)
    model = trainer.pipeline.model

    def poison(step: int) -> None:
        if step == 15:
            with torch.no_grad():
                model.gauss_params["opacities"].fill_(float("nan"))  # in place: the graph keeps replaying

    trainer.callbacks.append(TrainingCallback([TrainingCallbackLocation.BEFORE_TRAIN_ITERATION], poison))
    trainer.train()
    assert len(trainer.guard.events) == 1 and "step 15" in trainer.guard.events[0]
    assert "before step 10" in trainer.guard.events[0]  # checked every 10 steps (cpu_config)
    assert all(torch.isfinite(p).all() for p in model.gauss_params.values())
    assert trainer.step_graph.captures >= 2  # the restore made new tensors


@gpu
def test_a_random_background_is_drawn_anew_in_every_replay(tmp_path):
    """Splatfacto's default random background: torch.rand recorded in the graph draws new values on each replay
    (CUDA's graph-safe generator), it is not the recording's draw frozen."""
    trainer = _gpu_trainer(tmp_path, 12, True, warmup_length=1000)
    model = trainer.pipeline.model
    model.config.background_color = "random"
    drawn: list[torch.Tensor] = []
    original = model._get_background_color

    def keep(*args, **kwargs) -> torch.Tensor:
        drawn.append(original(*args, **kwargs))  # a replay refills the recorded draw's tensor in place
        return drawn[-1]

    model._get_background_color = keep
    seen = []
    trainer.callbacks.append(
        TrainingCallback([TrainingCallbackLocation.AFTER_TRAIN_ITERATION], lambda step: seen.append(drawn[-1].clone()))
    )
    trainer.train()
    assert trainer.step_graph.replays >= 8
    replayed = seen[-8:]  # steps 4-11: one recording, replayed
    assert all(not torch.equal(a, b) for a, b in zip(replayed, replayed[1:]))
    assert all(((0 <= c) & (c <= 1)).all() for c in replayed)


@gpu
def test_no_garbage_collection_starts_while_the_step_is_recorded(tmp_path):
    """Python's cycle collector may free garbage that holds CUDA resources (an earlier trainer's graph) with calls
    a recording thread may not make, failing the recording later at an unrelated op: with collections made
    frequent, none starts inside a recording, and the step records and replays."""
    trainer = _gpu_trainer(tmp_path, 12, True, warmup_length=1000)
    during: list[int] = []

    def watch(phase: str, info: dict) -> None:
        if phase == "start" and torch.cuda.is_current_stream_capturing():
            during.append(info["generation"])

    thresholds = gc.get_threshold()
    gc.set_threshold(20, 2, 2)
    gc.callbacks.append(watch)
    try:
        trainer.train()
    finally:
        gc.callbacks.remove(watch)
        gc.set_threshold(*thresholds)
    assert trainer.step_graph.captures >= 1 and trainer.step_graph.replays >= 8, trainer.step_graph.summary()
    assert during == [], f"{len(during)} collections started while recording"
