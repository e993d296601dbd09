"""Multi-process bytesplat training over gloo on the CPU: ranks stay identical, a dead rank stops the others,
checkpoints move between GPU counts, and the views-per-step rule."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from bytesplat_method_configs import bytesplat
from bytesplat_ns.late_read import STEPS_LATE
from bytesplat_ns.view_schedule import per_step_views, resumed_start_step, views_to_steps
from tests.distributed_rank import PAUSE_S, rank_config, scene_path

REPO = Path(__file__).resolve().parents[1]
VIEWS = 48
"""Training views of the 2-rank run (24 steps of 2 views); refines every 8 views from view 8."""
RANK_TIMEOUT_S = 300
DEAD_RANK_EXIT_S = 60


def start_ranks(root: Path, world: int, *extra: str, signal_at: dict[int, tuple[int, int]] | None = None
                ) -> list[subprocess.Popen]:  # fmt: skip
    """The ranks' processes (tests/distributed_rank.py). Each writes its output to a file (`rank_output`), not a
    pipe: a pipe nobody drains while the test waits for another rank would stop a rank that prints much, and with
    it every rank's collectives."""
    scene_path(root)  # written once, before the ranks start
    init_file = root / f"init-{time.monotonic_ns()}"
    procs = []
    for rank in range(world):
        args = [sys.executable, "-X", "faulthandler", "-m", "tests.distributed_rank", str(rank), str(world),
                str(init_file), str(root), *extra]  # fmt: skip
        if signal_at and rank in signal_at:
            args += ["--signal-at", *map(str, signal_at[rank])]
        log = Path(f"{init_file}-rank{rank}.log")
        with open(log, "w") as out:
            env = dict(os.environ, PYTHONUNBUFFERED="1", COLUMNS="200", OMP_NUM_THREADS="1")
            proc = subprocess.Popen(args, cwd=REPO, stdout=out, stderr=subprocess.STDOUT, env=env)
        proc.output_path = log
        procs.append(proc)
    return procs


def rank_output(proc: subprocess.Popen) -> str:
    """What a rank started by `start_ranks` has printed so far."""
    return proc.output_path.read_text(errors="replace")


def finish(procs: list[subprocess.Popen]) -> list[str]:
    """Every rank's output once all have exited with 0; a rank still running after RANK_TIMEOUT_S gets SIGABRT,
    whose faulthandler prints where each of its threads was, and the test fails with every rank's output."""
    deadline = time.monotonic() + RANK_TIMEOUT_S
    try:
        for proc in procs:
            proc.wait(timeout=max(deadline - time.monotonic(), 1))
    except subprocess.TimeoutExpired:
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGABRT)
            proc.wait()
        tails = "\n".join(f"--- rank {r}:\n{_before_and_stacks(rank_output(p))}" for r, p in enumerate(procs))
        pytest.fail(f"ranks still running after {RANK_TIMEOUT_S} s; their output and stacks:\n{tails}")
    outputs = [rank_output(p) for p in procs]
    for rank, (proc, out) in enumerate(zip(procs, outputs)):
        assert proc.returncode == 0, f"rank {rank} failed:\n{out[-4000:]}"
    return outputs


def _before_and_stacks(output: str) -> str:
    """The end of a rank's output before faulthandler's report, and the report (each thread's stack, innermost
    call first)."""
    report = output.rfind("Fatal Python error")
    return output[-6000:] if report < 0 else output[max(report - 3000, 0) : report + 12000]


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("dist")
    finish(start_ranks(root, 2, "--views", str(VIEWS), "--half-exchange"))  # compacted rows (distributed_rank.py)
    return root


def test_ranks_hold_equal_splat_counts_after_every_step(two_ranks):
    counts = [torch.load(two_ranks / f"rank{r}.pt")["counts"] for r in range(2)]
    assert counts[0] == counts[1]
    assert len(counts[0]) == VIEWS // 2
    assert len(set(counts[0])) > 1, f"no refine changed the splat count: {counts[0]}"


def test_every_rank_writes_its_run_stats(two_ranks):
    run = two_ranks / "out" / "dist" / "bytesplat" / "run"
    stats = [json.loads((run / name).read_text()) for name in ("bytesplat_stats.json", "bytesplat_stats_rank1.json")]
    for record in stats:
        assert record["views_per_step"] == 2 and record["steps"] == VIEWS // 2
        assert set(record["phase_ms"]) == {"forward", "backward", "exchange", "optimizer", "callbacks"}
        parts = record["exchange_parts_ms"]  # where the exchange phase's host time goes
        assert set(parts) == {"late read", "pack", "all-gather", "unpack", "header copy"}, parts
        assert 0 < sum(parts.values()) <= record["phase_ms"]["exchange"]
        assert record["exchange_dense_steps"] == 0
    assert 0 < stats[0]["exchange_sent_bytes"] < stats[0]["exchange_dense_bytes"]


def test_parameters_equal_across_ranks_at_the_end(two_ranks):
    params = [torch.load(two_ranks / f"rank{r}.pt")["params"] for r in range(2)]
    for name in params[0]:
        assert torch.equal(params[0][name], params[1][name]), name
        assert torch.isfinite(params[0][name]).all(), name


def identical_ranks_stats(root: Path) -> dict:
    """Assert that the two ranks of the run in `root` held equal splat counts after every step (some refine changed
    them) and equal, finite parameters at the end. -> rank 0's bytesplat_stats.json."""
    records = [torch.load(root / f"rank{r}.pt") for r in range(2)]
    assert records[0]["counts"] == records[1]["counts"] and len(set(records[0]["counts"])) > 1
    for name, param in records[0]["params"].items():
        assert torch.equal(param, records[1]["params"][name]), name
        assert torch.isfinite(param).all(), name
    return json.loads((root / "out" / "dist" / "bytesplat" / "run" / "bytesplat_stats.json").read_text())


def test_two_ranks_routing_rows_to_owners_stay_identical(tmp_path):
    """The exchange with its rows routed to owner ranks (all-to-all, the owners' sums all-gathered) through the
    same training, refines renumbering the splats: equal splat counts after every step, equal parameters at the
    end, and the routing round in the exchange's parts."""
    finish(start_ranks(tmp_path, 2, "--views", str(VIEWS), "--half-exchange", "--route-from", "2"))
    stats = identical_ranks_stats(tmp_path)
    assert "route" in stats["exchange_parts_ms"] and stats["exchange_dense_steps"] == 0
    assert 0 < stats["exchange_sent_bytes"] < stats["exchange_dense_bytes"]


def test_two_ranks_exchanging_screen_gradients_stay_identical(tmp_path):
    """The screen exchange (each view's screen-space gradients, carried back to the parameters on every rank) through
    the same training, refines renumbering the splats: equal splat counts after every step, equal parameters at the
    end, and 9 values a splat sent against a dense all-reduce's 59."""
    finish(start_ranks(tmp_path, 2, "--views", str(VIEWS), "--exchange", "screen"))
    stats = identical_ranks_stats(tmp_path)
    assert set(stats["exchange_parts_ms"]) == {"late read", "pack", "all-gather", "unpack", "header copy"}
    assert 0 < stats["exchange_sent_bytes"] < 0.2 * stats["exchange_dense_bytes"]


def test_two_ranks_one_step_late_stay_identical(tmp_path):
    """Each step's averaged gradients applied at the next step (late_update.py) through the same training, refines
    and opacity resets renumbering and editing the splats (the packed rows applied before each), a checkpoint at the
    end: equal splat counts after every step, equal parameters at the end, compacted rows every step."""
    finish(start_ranks(tmp_path, 2, "--views", str(VIEWS), "--one-step-late"))
    stats = identical_ranks_stats(tmp_path)
    assert stats["exchange_dense_steps"] == 0 and stats["exchange_sent_bytes"] > 0
    pending = torch.load(tmp_path / "rank0.pt")["pending"]
    assert len(pending) == VIEWS // 2 and any(edits for _, edits in pending) and not all(p for p, _ in pending)
    assert all(rows != edits for rows, edits in pending), pending  # applied before the callbacks edit the splats


@pytest.mark.parametrize("draws", ["matched", "shuffled"])
def test_two_ranks_draw_disjoint_shards_in_step_and_stay_identical(tmp_path, draws):
    """Matched draws (the default, datamanager.py): every rank's epoch is ceil(7 / 2) = 4 draws covering its shard
    (the shard of 3 draws one camera twice), so the ranks' epochs stay aligned; shuffled draws: each rank's epoch is
    its shard in a new order. Either way the ranks stay identical. (On the CPU the renderer does not bin through
    BinCapacity, so no costs are known: matched draws go by camera index; the ranking itself is tested in
    test_grad_compaction.py.)"""
    finish(start_ranks(tmp_path, 2, "--views", str(VIEWS), *(["--shuffled-draws"] if draws == "shuffled" else [])))
    identical_ranks_stats(tmp_path)
    drawn = [torch.load(tmp_path / f"rank{r}.pt")["drawn"] for r in range(2)]
    shards = [set(d) for d in drawn]
    assert not shards[0] & shards[1] and len(shards[0] | shards[1]) == 7
    for rank_drawn, shard in zip(drawn, shards):
        assert len(rank_drawn) == VIEWS // 2
        epoch = 4 if draws == "matched" else len(shard)
        assert all(set(rank_drawn[e : e + epoch]) == shard for e in range(0, len(rank_drawn) - epoch + 1, epoch))


def test_only_rank0_writes_the_checkpoint_and_it_resumes_on_one_process(two_ranks, tmp_path):
    ckpt_dir = two_ranks / "out" / "dist" / "bytesplat" / "run" / "nerfstudio_models"
    saved = sorted(ckpt_dir.glob("*.ckpt"))
    assert [p.name for p in saved] == [f"step-{VIEWS // 2 - 1:09d}.ckpt"]
    state = torch.load(saved[0], map_location="cpu", weights_only=False)
    assert state["pipeline"]["_model._extra_state"]["views_per_step"] == 2

    config = rank_config(two_ranks, views=8, load_dir=ckpt_dir)
    config.output_dir = tmp_path / "resumed"
    trainer = config.setup(local_rank=0, world_size=1)
    trainer.setup()
    assert trainer._start_step == VIEWS  # 24 steps of 2 views = 48 views = step 48 of 1 view
    final = torch.load(two_ranks / "rank0.pt")["params"]
    assert torch.equal(trainer.pipeline.model.means.detach(), final["means"])
    lr = trainer.optimizers.optimizers["opacities"].param_groups[0]["lr"]
    assert lr == pytest.approx(config.optimizers["opacities"]["optimizer"].lr)  # 1-GPU rate, not sqrt(2) times it
    trainer.train()
    assert trainer.step == VIEWS + 8 - 1


@pytest.mark.parametrize("how", ["killed", "hung"])
def test_a_dead_or_hung_rank_stops_the_others_with_a_message(tmp_path, how):
    """Killed: the collective fails at once. Hung (SIGSTOP): the collective waits, the watchdog sees no heartbeat."""
    sig = signal.SIGKILL if how == "killed" else signal.SIGSTOP
    procs = start_ranks(tmp_path, 2, "--views", "400", signal_at={1: (6, int(sig))})
    try:
        if how == "killed":
            procs[1].wait(timeout=RANK_TIMEOUT_S)
        else:
            while not _stopped(procs[1].pid):
                assert procs[1].poll() is None
                time.sleep(0.2)
        since = time.monotonic()
        procs[0].wait(timeout=RANK_TIMEOUT_S)
        waited = time.monotonic() - since
        out = rank_output(procs[0])
    finally:
        procs[1].kill()
        procs[1].wait()
    assert procs[0].returncode != 0
    assert waited < DEAD_RANK_EXIT_S, waited
    messages = ["rank 1 has sent no heartbeat"] + (["other ranks exited first"] if how == "killed" else [])
    assert any(m in " ".join(out.split()) for m in messages), out[-3000:]  # killed: gloo fails at once, or the watchdog


@pytest.mark.parametrize("where", ["cpu", pytest.param("cuda", marks=pytest.mark.two_gpus)])
def test_rank0_pause_and_stop_reach_every_rank(tmp_path, where):
    """Rank 0 pauses (as its viewer would) after step 4 and gets Ctrl-C after step 14. The requests travel with
    the next step's gradient exchange, whose headers are read STEPS_LATE exchanges later, so both ranks pause
    after step 5 + STEPS_LATE, resume together, and stop after step 15 + STEPS_LATE, with rank 0 writing the
    final checkpoint. On GPUs the exchange is part of the replayed step graph."""
    extra = ["--cuda"] if where == "cuda" else []
    procs = start_ranks(tmp_path, 2, "--views", "400", "--pause-at", "4", *extra,
                        signal_at={0: (14, int(signal.SIGINT))})  # fmt: skip
    finish(procs)
    records = [torch.load(tmp_path / f"rank{r}.pt") for r in range(2)]
    paused_after, stopped_after = 5 + STEPS_LATE, 15 + STEPS_LATE
    for rank, record in enumerate(records):
        gaps = [round(b - a, 2) for a, b in zip(record["times"], record["times"][1:])]
        # one pause, at the top of the step after `paused_after`, lasting until rank 0 resumed
        resumed = [0] * (paused_after + 1) + [1] * (len(gaps) - paused_after)
        assert record["resumes"] == resumed, (rank, record["resumes"], gaps)
        assert gaps[paused_after] > PAUSE_S * 0.9, (rank, gaps)
    assert [r["step"] for r in records] == [stopped_after, stopped_after]
    assert len(records[0]["counts"]) == len(records[1]["counts"]) == stopped_after + 1
    ckpts = list((tmp_path / "out" / "dist" / "bytesplat" / "run" / "nerfstudio_models").glob("*.ckpt"))
    assert [p.name for p in ckpts] == [f"step-{stopped_after:09d}.ckpt"]


def _stopped(pid: int) -> bool:
    return Path(f"/proc/{pid}/stat").read_text().split(") ")[1].startswith("T")


def test_views_per_step_rule():
    config = per_step_views(bytesplat.config, 4)
    assert config.max_num_iterations == 30000 // 4
    assert config.pipeline.model.refine_every == 25 and config.pipeline.model.views_per_step == 4
    base = bytesplat.config.optimizers["means"]
    means = config.optimizers["means"]
    assert means["optimizer"].lr == pytest.approx(2 * base["optimizer"].lr)
    assert means["scheduler"].lr_final == pytest.approx(2 * base["scheduler"].lr_final)
    assert means["scheduler"].max_steps == base["scheduler"].max_steps // 4
    assert bytesplat.config.max_num_iterations == 30000  # the saved config keeps views
    assert per_step_views(bytesplat.config, 1) is bytesplat.config
    assert views_to_steps(0, 3) == 0 and views_to_steps(1, 3) == 1
    assert resumed_start_step(100, 2, 4) == 50 and resumed_start_step(100, 4, 1) == 400


def _lone_rank_replays(tmp_path, *options: str) -> dict:
    """Train one GPU standing in for rank 0 of two (tests/distributed_rank.py) with `options`; check that its steps
    were replayed from the step graph, that refines changed the splat count and that the parameters are finite.
    -> the rank's record."""
    views = 400  # refines until view 200, then steady steps
    finish(start_ranks(tmp_path, 1, "--views", str(views), "--cuda", *options, "--alone-as-rank-0-of-2"))
    record = torch.load(tmp_path / "rank0.pt")
    assert record["graph_off"] is None
    captures, replays = record["graph"]
    assert replays >= views // 4, record["graph"]
    assert len(set(record["counts"])) > 1, "no refine changed the splat count"
    for name, param in record["params"].items():
        assert torch.isfinite(param).all(), name
    return record


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the step graph needs a CUDA GPU")
def test_a_lone_rank_replays_its_steps_one_step_late(tmp_path):
    """One GPU standing in for rank 0 of two (tests/distributed_rank.py), one step late: its steps replayed from the
    step graph (the gather of the step before's rows on a side stream beside the render), the packed rows applied
    before every refine and opacity reset, finite parameters."""
    record = _lone_rank_replays(tmp_path, "--one-step-late")
    assert all(rows != edits for rows, edits in record["pending"]), record["pending"]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the step graph needs a CUDA GPU")
def test_a_lone_rank_replays_its_steps_reading_peer_rows(tmp_path):
    """One GPU standing in for rank 0 of two, the exchange reading peers' rows from their memory (peer_rows.py): its
    steps replayed from the step graph, refines changing the splat count (its region made again as they outgrow
    it), finite parameters, the region freed at the end."""
    _lone_rank_replays(tmp_path, "--peer-reads")


@pytest.mark.two_gpus
@pytest.mark.parametrize("values", ["float32", "float16", "float16-routed", "screen", "one-step-late", "peer-reads"])
def test_two_gpus_replay_the_step_graph_and_stay_identical(tmp_path, values):
    """On GPUs each rank replays its step, the exchange inside, as a CUDA graph (step_graph.py): the splat counts are
    equal after every step and the parameters at the end, as op by op. With float32 values the test scene's
    exchange is a dense all-reduce, with float16 compacted rows (distributed_rank.py), all-gathered or routed to
    owners (NCCL all-to-all in the graph); or the screen exchange (each rank backpropagates every view); or one step
    late (float32 compacted rows, gathered on a side stream beside the next step's render); or each rank reading the
    other's compacted rows from its memory (peer_rows.py)."""
    views = 400  # refines until view 200, then steady steps
    half = ["--half-exchange"] if values.startswith("float16") else []
    routed = ["--route-from", "2"] if values.endswith("routed") else []
    screen = ["--exchange", "screen"] if values == "screen" else []
    late = ["--one-step-late"] if values == "one-step-late" else []
    peers = ["--peer-reads"] if values == "peer-reads" else []
    finish(start_ranks(tmp_path, 2, "--views", str(views), "--cuda", *half, *routed, *screen, *late, *peers))
    records = [torch.load(tmp_path / f"rank{r}.pt") for r in range(2)]
    for record in records:
        assert record["graph_off"] is None
        captures, replays = record["graph"]
        assert replays >= views // 4, record["graph"]  # most of the 100 steady steps
    assert records[0]["counts"] == records[1]["counts"]
    assert len(set(records[0]["counts"])) > 1, "no refine changed the splat count"
    for name, param in records[0]["params"].items():
        assert torch.equal(param, records[1]["params"][name]), name
        assert torch.isfinite(param).all(), name
