"""bytesplat-compare: limits, verdict and paired statistics on hand-made records; two short CPU studies end to end."""

from __future__ import annotations

import dataclasses
import json
import math
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from bytesplat_ns.compare.cli import main, run_specs
from bytesplat_ns.compare.lanes import (
    cuda_visible_devices,
    devices_problem,
    lane_of_pair,
    parse_devices,
    plan_lanes,
    run_lanes,
)
from bytesplat_ns.compare.limits import KEEP, RETAIN, Limit, decide, parse_limits
from bytesplat_ns.compare.records import CurvePoint, RunRecord, RunSpec, StudyConfig, ViewMetrics, write_json
from bytesplat_ns.compare.report import write_report
from bytesplat_ns.compare.resume import MAY_CHANGE, OPTION_OF, STUDY_FILE, earlier_study_problem, reusable
from bytesplat_ns.compare.runner import worker_env
from bytesplat_ns.compare.stats import (
    Derived,
    derived_quantities,
    fill_time_to_target,
    make_pairs,
    metric_table,
    worse_views,
)
from bytesplat_ns.compare.worker import TrainingClock
from bytesplat_ns.demo_scene import DemoSceneConfig, generate_demo_scene
from bytesplat_ns.lpips import stand_in_lpips_unless_on_disk

SCENE = DemoSceneConfig(width=32, height=24, num_train=6, num_eval=2, num_points=300, seed=2)


# -- hand-made records ----------------------------------------------------------------------------
def make_run(role, seed, pair, psnr, curve, train_s, views=(), method=None) -> RunRecord:
    """curve: [(step, train_s, psnr)]; views: [(name, psnr)]."""
    return RunRecord(
        method=method or ("splatfacto" if role == "baseline" else "bytesplat"),
        role=role,
        seed=seed,
        pair=pair,
        status="ok",
        run_dir=f"runs/{seed}-{role}",
        steps=100,
        psnr=psnr,
        ssim=0.9 if role == "baseline" else 0.899,
        startup_s=5.0,
        train_s=train_s,
        step_ms=10 * train_s,
        splats=1000,
        curve=[CurvePoint(step=s, train_s=t, psnr=p) for s, t, p in curve],
        views=[
            ViewMetrics(name, p, 0.9, None, f"runs/{seed}-{role}/renders/{i:03d}.png", f"gt/{i:03d}.png")
            for i, (name, p) in enumerate(views)
        ],
        heldout_views=[name for name, _ in views],
    )


def two_pairs() -> list[RunRecord]:
    """Seed 1: baseline 30 dB after 10 s (first at 8 s), candidate reaches 30 dB at 4 s, ends at 30.05 dB.
    Seed 2: baseline 31 dB after 12 s, candidate reaches it at 6 s, ends at 30.95 dB."""
    return [
        make_run("baseline", 1, 0, 30.0, [(50, 5, 29.0), (100, 8, 30.0), (150, 10, 30.0)], 10.0),
        make_run("candidate", 1, 0, 30.05, [(50, 4, 30.0), (100, 6, 30.05)], 6.0),
        make_run("baseline", 2, 1, 31.0, [(50, 6, 30.0), (100, 12, 31.0)], 12.0),
        make_run("candidate", 2, 1, 30.95, [(50, 6, 31.0), (100, 9, 30.95)], 9.0),
    ]


def test_parse_limits():
    limits = parse_limits("psnr_drop<=0.1, ssim_drop <= 2e-3,speedup>=1.5")
    assert limits == [Limit("psnr_drop", "<=", 0.1), Limit("ssim_drop", "<=", 0.002), Limit("speedup", ">=", 1.5)]
    assert [str(limit) for limit in limits] == ["psnr_drop<=0.1", "ssim_drop<=0.002", "speedup>=1.5"]
    assert Limit("speedup", ">", 1.0).holds(1.5) and not Limit("speedup", ">", 1.0).holds(1.0)
    assert not Limit("psnr_drop", "<=", 0.1).holds(None)  # not measured: does not hold
    with pytest.raises(ValueError, match="Unknown quantity 'fps'"):
        parse_limits("fps>=2")
    with pytest.raises(ValueError, match="Cannot read"):
        parse_limits("psnr_drop=<0.1")
    with pytest.raises(ValueError, match="No limits"):
        parse_limits(" , ")


def test_verdict_keep_when_every_limit_holds():
    limits = parse_limits("psnr_drop<=0.1,speedup>=1.5")
    derived = {"psnr_drop": Derived(0.05, [0.05]), "speedup": Derived(2.0, [2.0])}
    verdict = decide(limits, derived)
    assert verdict.decision == KEEP
    assert verdict.reasons and "psnr_drop<=0.1" in verdict.reasons[0] and "speedup>=1.5" in verdict.reasons[0]
    assert all(check.holds for check in verdict.checks)


def test_verdict_retain_names_the_failed_limit_and_failed_runs():
    limits = parse_limits("psnr_drop<=0.1,speedup>=1.5")
    verdict = decide(limits, {"psnr_drop": Derived(0.3, [0.3]), "speedup": Derived(2.0, [2.0])})
    assert verdict.decision == RETAIN
    assert len(verdict.reasons) == 1 and "psnr_drop<=0.1" in verdict.reasons[0] and "0.3" in verdict.reasons[0]
    unmeasured = decide(limits, {"psnr_drop": Derived(0.0, [0.0]), "speedup": Derived(None, [None], "never reached")})
    assert unmeasured.decision == RETAIN and "speedup>=1.5" in unmeasured.reasons[0]
    assert "not measured (never reached)" in unmeasured.reasons[0]
    failed = decide(limits, {"psnr_drop": Derived(0.0, [0.0]), "speedup": Derived(2.0, [2.0])}, ["baseline x: boom"])
    assert failed.decision == RETAIN and failed.reasons == ["run failed: baseline x: boom"]


def test_paired_statistics():
    pairs = make_pairs(two_pairs())
    assert [p.seed for p in pairs] == [1, 2] and all(p.complete for p in pairs)
    fill_time_to_target(pairs)
    # the baseline's time to its own final PSNR is its first evaluation at that PSNR, not its last
    assert pairs[0].baseline.time_to_target == 8 and pairs[0].candidate.time_to_target == 4
    assert pairs[1].baseline.time_to_target == 12 and pairs[1].candidate.time_to_target == 6
    assert pairs[1].candidate.target_psnr == 31.0

    table = metric_table(pairs)
    assert table["psnr"]["baseline"].mean == pytest.approx(30.5)
    assert table["psnr"]["baseline"].std == pytest.approx(math.sqrt(0.5))  # sample std of (30, 31)
    assert table["psnr"]["diff"].mean == pytest.approx(0.0) and table["psnr"]["diff"].n == 2
    assert table["train_s"]["diff"].mean == pytest.approx(-3.5)  # (6-10 + 9-12) / 2
    assert table["peak_mem"]["baseline"].mean is None and table["peak_mem"]["baseline"].n == 0

    derived = derived_quantities(pairs)
    assert derived["psnr_drop"].value == pytest.approx(0.0)  # (-0.05 + 0.05) / 2
    assert derived["ssim_drop"].value == pytest.approx(0.001)
    assert derived["speedup"].per_pair == [2.0, 2.0] and derived["speedup"].value == pytest.approx(2.0)
    assert derived["train_speedup"].value == pytest.approx((10 / 6 + 12 / 9) / 2)
    assert derived["lpips_rise"].value is None and derived["mem_ratio"].value is None

    # a candidate that never reaches its pair's target: no speedup, and the speedup limit fails
    runs = two_pairs()
    runs[3].curve = [CurvePoint(50, 6, 30.0), CurvePoint(100, 9, 30.5)]
    pairs = make_pairs(runs)
    fill_time_to_target(pairs)
    derived = derived_quantities(pairs)
    assert pairs[1].candidate.time_to_target is None and derived["speedup"].value is None
    assert "never reached" in derived["speedup"].note
    assert decide(parse_limits("speedup>=1.5"), derived).decision == RETAIN

    # a failed run leaves its pair out of the paired numbers
    runs = two_pairs()
    runs[2].status, runs[2].error = "failed", "Traceback ...\nRuntimeError: no GPU"
    pairs = make_pairs(runs)
    fill_time_to_target(pairs)
    assert metric_table(pairs)["psnr"]["diff"].n == 1 and derived_quantities(pairs)["speedup"].per_pair == [2.0]


def _png(path: Path, value: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(np.full((6, 8, 3), value, np.uint8)).save(path)


def test_report_from_hand_made_records(tmp_path):
    runs = two_pairs()
    views = {"baseline": [("a.png", 30.0), ("b.png", 31.0)], "candidate": [("a.png", 30.4), ("b.png", 29.0)]}
    for run in runs:
        run.views = make_run(run.role, run.seed, run.pair, 0, [], 0, views[run.role]).views
        run.heldout_views = ["a.png", "b.png"]
        for view in run.views:
            _png(tmp_path / view.render, 100)
            _png(tmp_path / view.gt, 200)
    assert [(w["seed"], w["view"]) for w in worse_views(make_pairs(runs), 0.5)] == [(1, "b.png"), (2, "b.png")]

    study = StudyConfig(str(tmp_path / "scene"), "splatfacto", "bytesplat", 100, [1, 2], 50, "cpu", 1,
                        "psnr_drop<=0.1,speedup>=1.5", [], str(tmp_path))  # fmt: skip
    report = write_report(study, runs)
    assert report["verdict"] == KEEP and report["heldout_views"] == ["a.png", "b.png"]
    assert report["derived"]["speedup"]["value"] == pytest.approx(2.0)
    assert json.loads((tmp_path / "report.json").read_text())["verdict"] == KEEP
    md = (tmp_path / "report.md").read_text()
    assert md.startswith("# splatfacto vs bytesplat: KEEP") and "(psnr_vs_time.png)" in md
    assert (tmp_path / "psnr_vs_time.png").stat().st_size > 0
    for item in report["worse_views"]:
        picture = Image.open(tmp_path / item["side_by_side"])
        assert picture.width == 3 * 8 * 16 + 2 * 4  # GT | baseline | candidate, enlarged 16x, 4-pixel gaps
        assert item["side_by_side"] in md

    interrupted = write_report(study, runs[:3], planned=4)  # the last run never made
    assert interrupted["verdict"] == RETAIN and "the study was interrupted: 3 of 4 runs made" in interrupted["reasons"]
    assert interrupted["metrics"]["psnr"]["diff"]["n"] == 1

    # --devices 0,1: the set-up says how runs were spread; a pair whose two runs had different GPUs is not fair
    study.lanes = [[0], [1]]
    for run, gpus in zip(runs, ([0], [0], [1], [1])):
        run.gpus = gpus
    spread = write_report(study, runs)
    assert spread["verdict"] == KEEP and spread["study"]["lanes"] == [[0], [1]]
    assert "- Pairs ran concurrently on 2 lanes: GPUs 0 | 1 (" in (tmp_path / "report.md").read_text()
    runs[3].gpus = [0]
    assert "seed 2: the two runs had different GPUs (GPU 1 and GPU 0)" in write_report(study, runs)["reasons"]


def test_cli_refuses_bad_limits_and_options_it_sets(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--data", str(tmp_path), "--limits", "speed>=2"])
    assert exit_info.value.code == 2 and "Unknown quantity 'speed'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--data", str(tmp_path), "--", "--max-num-iterations", "5", "--machine.seed=3"])
    err = capsys.readouterr().err
    assert "--max-num-iterations (use --steps)" in err and "--machine.seed (use --seeds)" in err
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "mine.txt").write_text("not a study")
    with pytest.raises(SystemExit):
        main(["--data", str(tmp_path), "--output", str(tmp_path / "out")])
    assert "is not empty and holds no earlier study" in capsys.readouterr().err


def test_training_clock_keeps_evaluation_out_of_training_time():
    spec = RunSpec("bytesplat", "baseline", 0, 0, "scene", steps=5, eval_every=2, device="cpu", num_devices=1,
                   extra_args=[], output_dir="out", run_dir="out/run", gt_dir="out/gt")  # fmt: skip
    evaluations = []

    def slow_evaluation(final: bool):
        evaluations.append(final)
        time.sleep(0.2)
        return [ViewMetrics("a.png", 20.0 + len(evaluations), 0.5, None, "", "")]

    clock = TrainingClock(spec, 0, spec.steps, lambda: slow_evaluation(False), lambda: slow_evaluation(True))
    for step in range(5):
        clock.before_step(step)
        time.sleep(0.02)
        clock.after_step(step)
    assert [p.step for p in clock.curve] == [2, 4, 5] and evaluations == [False, False, True]
    assert [p.psnr for p in clock.curve] == [21.0, 22.0, 23.0] and clock.final_views[0].psnr == 23.0
    assert 0.1 <= clock.train_s < 0.4 <= clock.eval_s  # 5 x 20 ms of steps; 3 x 200 ms of evaluation left out
    assert clock.peak_mem is None  # CPU


def test_lpips_stand_in_only_without_weights(monkeypatch, tmp_path):
    import torchmetrics.image
    import torchmetrics.image.lpip

    import bytesplat_ns.lpips

    original = torchmetrics.image.lpip.LearnedPerceptualImagePatchSimilarity
    monkeypatch.setattr(torchmetrics.image.lpip, "LearnedPerceptualImagePatchSimilarity", original)  # undone after
    monkeypatch.setattr(torchmetrics.image, "LearnedPerceptualImagePatchSimilarity", original)
    on_disk = tmp_path / "alexnet.pth"
    on_disk.write_bytes(b"")
    monkeypatch.setattr(bytesplat_ns.lpips, "alexnet_weights_path", lambda: on_disk)
    assert (
        not stand_in_lpips_unless_on_disk()
        and torchmetrics.image.lpip.LearnedPerceptualImagePatchSimilarity is original
    )
    monkeypatch.setattr(bytesplat_ns.lpips, "alexnet_weights_path", lambda: tmp_path / "missing.pth")
    assert stand_in_lpips_unless_on_disk()
    from torchmetrics.image.lpip import LearnedPerceptualImagePatchSimilarity  # as splatfacto imports it

    value = LearnedPerceptualImagePatchSimilarity(normalize=True)(torch.zeros(1, 3, 4, 4), torch.ones(1, 3, 4, 4))
    assert math.isnan(float(value))  # reported as null


# -- --devices lanes and resuming, without training ------------------------------------------------
def test_lanes_and_pair_assignment():
    assert parse_devices("0, 1") == [0, 1]
    assert plan_lanes([0, 1], 1) == [[0], [1]] and plan_lanes([3, 1], 1) == [[3], [1]]
    assert plan_lanes([0, 1, 2, 3], 2) == [[0, 1], [2, 3]] and plan_lanes([0, 1], 2) == [[0, 1]]
    for num_pairs in range(1, 9):
        for num_lanes in range(1, 5):
            lanes = [[p for p in range(num_pairs) if lane_of_pair(p, num_lanes) == lane] for lane in range(num_lanes)]
            assert sorted(sum(lanes, [])) == list(range(num_pairs))  # every pair once
            assert max(map(len, lanes)) == math.ceil(num_pairs / num_lanes)  # the longest lane is as short as can be
            assert all(lane == sorted(lane) for lane in lanes)

    study = StudyConfig("scene", "splatfacto", "bytesplat", 10, [7, 8, 9], 5, "cuda", 1, "speedup>=1", [], "/out",
                        lanes=[[0], [1]])  # fmt: skip
    specs = run_specs(study)
    assert [(s.seed, s.role, s.gpus) for s in specs] == [
        (7, "baseline", [0]), (7, "candidate", [0]), (8, "baseline", [1]), (8, "candidate", [1]),
        (9, "baseline", [0]), (9, "candidate", [0]),
    ]  # fmt: skip


def test_worker_cuda_visible_devices(monkeypatch):
    assert cuda_visible_devices([1], None) == "1" and cuda_visible_devices([0, 1], "") == "0,1"
    assert cuda_visible_devices([0, 1], "4,5,6") == "4,5"  # GPU 0 here is the inherited list's first
    assert cuda_visible_devices([1], "GPU-aaa, GPU-bbb") == "GPU-bbb"
    with pytest.raises(ValueError, match="GPU 3 is not among CUDA_VISIBLE_DEVICES=4,5"):
        cuda_visible_devices([3], "4,5")

    spec = RunSpec("bytesplat", "baseline", 0, 0, "scene", steps=5, eval_every=2, device="cuda", num_devices=1,
                   extra_args=[], output_dir="out", run_dir="out/run", gt_dir="out/gt")  # fmt: skip
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    assert worker_env(spec)[0]["CUDA_VISIBLE_DEVICES"] == "2,3"  # no --devices: left as it is
    spec.gpus = [1]
    assert worker_env(spec)[0]["CUDA_VISIBLE_DEVICES"] == "3"
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert worker_env(spec)[0]["CUDA_VISIBLE_DEVICES"] == "1"


def test_run_lanes_side_by_side_each_in_order():
    both_started = threading.Barrier(2, timeout=10)  # broken (an error) if the lanes ran one after the other
    done: list[tuple[str, int]] = []

    def run(item: tuple[str, int]) -> None:
        if item[1] == 0:
            both_started.wait()
        time.sleep(0.01)
        done.append(item)

    run_lanes([[("a", 0), ("a", 1), ("a", 2)], [("b", 0), ("b", 1)]], run)
    assert [i for i in done if i[0] == "a"] == [("a", 0), ("a", 1), ("a", 2)]
    assert [i for i in done if i[0] == "b"] == [("b", 0), ("b", 1)]

    started = []
    slow_started = threading.Event()

    def fail_fast(item: str) -> None:
        started.append(item)
        if item == "boom":
            slow_started.wait(timeout=10)
            raise RuntimeError("boom")
        slow_started.set()
        time.sleep(0.5)  # in progress when the other lane fails: it ends, and nothing after it starts

    with pytest.raises(RuntimeError, match="boom"):
        run_lanes([["boom"], ["slow", "never"]], fail_fast)
    assert sorted(started) == ["boom", "slow"]


def test_cli_refuses_bad_devices(tmp_path, capsys, monkeypatch):
    out = tmp_path / "out"
    common = ["--data", str(tmp_path), "--output", str(out)]
    errors = {
        ("--devices", "0,1", "--device", "cpu"): "--device is cpu: use --device cuda, or leave out --devices",
        ("--devices", "0,x", "--device", "cuda"): "'x' is not a GPU index; write indices like 0,1",
        ("--devices", "0,0", "--device", "cuda"): "--devices 0,0 lists GPU 0 more than once",
        ("--devices", "0,2", "--device", "cuda"): "no GPU 2 here; this process sees 2 GPU(s) (0-1): list only those",
        ("--devices", "1", "--device", "cuda", "--num-devices", "2"): "fewer GPUs than --num-devices 2",
    }
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    for args, message in errors.items():
        with pytest.raises(SystemExit) as exit_info:
            main([*common, *args])
        assert exit_info.value.code == 2 and message in capsys.readouterr().err, args
    assert not out.exists()
    assert "would leave GPU 2 unused with --num-devices 2" in devices_problem([0, 1, 2], 2, "cuda", 4)
    assert "sees no GPU; leave out --devices to run on the CPU" in devices_problem([0], 1, "auto", 0)
    assert devices_problem([1, 0], 1, "cuda", 2) is None


def test_resume_rules(tmp_path):
    assert set(OPTION_OF) | set(MAY_CHANGE) == {f.name for f in dataclasses.fields(StudyConfig)}
    study = StudyConfig(str(tmp_path / "scene"), "splatfacto", "bytesplat", 10, [7], 5, "cpu", 1, "speedup>=1", [],
                        str(tmp_path))  # fmt: skip
    assert earlier_study_problem(tmp_path, study) is None  # no earlier study
    write_json(tmp_path / STUDY_FILE, dataclasses.asdict(study))
    moved = dataclasses.replace(study, output="/elsewhere", run_timeout_s=60.0, lanes=[[0]])
    assert earlier_study_problem(tmp_path, moved) is None  # only how and where runs are made changed
    other = dataclasses.replace(study, steps=20, extra_args=["--pipeline.model.sh-degree", "1"])
    problem = earlier_study_problem(tmp_path, other)
    assert "--steps: 10 there, 20 now; ns-train options (after --): (none) there, --pipeline.model.sh-degree 1 now" in (
        problem
    )
    assert f"choose another --output, or delete {tmp_path} to start this study there" in problem
    (tmp_path / STUDY_FILE).write_text("{not json")
    assert "cannot be read as a study" in earlier_study_problem(tmp_path, study)

    spec = run_specs(study)[0]
    run_dir = Path(spec.run_dir)
    assert reusable(spec) == (None, "")  # never started
    run_dir.mkdir(parents=True)
    assert reusable(spec) == (None, "an earlier attempt did not finish")
    record = RunRecord(spec.method, spec.role, spec.seed, spec.pair, status="ok", steps=10, psnr=20.0)
    write_json(run_dir / "record.json", record.to_dict())
    assert reusable(spec)[0].psnr == 20.0
    for change, why in [({"steps": 4}, "stopped after 4 of 10 steps"), ({"status": "failed"}, "attempt failed")]:
        write_json(run_dir / "record.json", dataclasses.replace(record, **change).to_dict())
        assert reusable(spec)[0] is None and why in reusable(spec)[1]
    (run_dir / "record.json").write_text("")
    assert "earlier record cannot be read" in reusable(spec)[1]


# -- short CPU studies ----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def scene(tmp_path_factory) -> Path:
    return generate_demo_scene(tmp_path_factory.mktemp("compare") / "scene", SCENE)


PER_RUN_FIELDS = ("psnr", "ssim", "lpips", "startup_s", "train_s", "eval_s", "step_ms", "peak_mem", "splats",
                  "bytes_exchanged", "time_to_target", "curve", "views", "heldout_views", "config")  # fmt: skip


def run_cpu_study(scene, out, baseline: str, steps: int, eval_every: int, num_devices: int = 1):
    """One seed, bytesplat as the candidate, on the CPU; returns the output folder."""
    main(["--data", str(scene), "--baseline", baseline, "--candidate", "bytesplat", "--steps", str(steps),
          "--seeds", "1", "--eval-every", str(eval_every), "--device", "cpu", "--output", str(out),
          "--num-devices", str(num_devices), "--", "--pipeline.model.num-downscales", "0"])  # fmt: skip
    return out


@pytest.mark.slow
def test_two_process_runs_record_the_bytes_exchanged(scene, tmp_path):
    """--num-devices 2: each run trains in two processes (gloo on the CPU; NCCL on GPUs), rank 0 records it."""
    out = run_cpu_study(scene, tmp_path / "two", baseline="bytesplat", steps=20, eval_every=10, num_devices=2)
    runs = json.loads((out / "report.json").read_text())["runs"]
    for run in runs:
        assert run["status"] == "ok", run["error"]
        assert run["steps"] == 20  # views, as --steps counts them: 10 steps of 2 views
        assert [p["step"] for p in run["curve"]] == [5, 10]
        assert run["bytes_exchanged"] > 0


@pytest.fixture(scope="module")
def aa_study(scene, tmp_path_factory) -> Path:
    """An A/A study (bytesplat against itself, 30 steps), made once for the tests that read it."""
    return run_cpu_study(scene, tmp_path_factory.mktemp("aa") / "aa", baseline="bytesplat", steps=30, eval_every=10)


@pytest.mark.slow
def test_a_a_study_end_to_end(aa_study):
    out = aa_study
    report = json.loads((out / "report.json").read_text())
    assert report["verdict"] in (KEEP, RETAIN) and report["reasons"]
    assert len(report["heldout_views"]) == SCENE.num_eval
    assert all(name.startswith("images/") for name in report["heldout_views"])
    md = (out / "report.md").read_text()
    assert report["verdict"] in md and all(name in md for name in report["heldout_views"])
    assert (out / report["plot"]).stat().st_size > 0

    runs = report["runs"]
    assert [(r["role"], r["seed"]) for r in runs] == [("baseline", 42), ("candidate", 42)]
    for run in runs:
        assert run["status"] == "ok", run["error"]
        for name in PER_RUN_FIELDS:
            assert name in run, name
        assert run["steps"] == 30 and run["peak_mem"] is None and run["bytes_exchanged"] is None
        assert run["startup_s"] > 0 and run["train_s"] > 0 and run["eval_s"] > 0 and run["splats"] > 0
        assert [p["step"] for p in run["curve"]] == [10, 20, 30]
        assert [p["train_s"] for p in run["curve"]] == sorted(p["train_s"] for p in run["curve"])
        assert run["curve"][-1]["psnr"] == pytest.approx(run["psnr"])
        assert run["time_to_target"] is not None  # same method, same seed: the candidate reaches the target
        assert [v["name"] for v in run["views"]] == report["heldout_views"]
        for view in run["views"]:
            assert (out / view["render"]).is_file() and (out / view["gt"]).is_file()
        assert (out / run["config"]).is_file()
    # same method, same seed, same data, on the CPU: the same result
    assert runs[0]["psnr"] == pytest.approx(runs[1]["psnr"], abs=1e-4)
    assert report["derived"]["psnr_drop"]["value"] == pytest.approx(0.0, abs=1e-4)


def run_files(out: Path) -> dict[str, int]:
    """Every file under the study's runs/ -> its modification time [ns]."""
    return {str(p.relative_to(out)): p.stat().st_mtime_ns for p in sorted((out / "runs").rglob("*")) if p.is_file()}


@pytest.mark.slow
def test_same_study_again_reuses_its_runs_and_another_is_refused(scene, aa_study, capsys):
    out = aa_study
    before, report = run_files(out), json.loads((out / "report.json").read_text())
    (out / "report.md").unlink()
    capsys.readouterr()

    run_cpu_study(scene, out, baseline="bytesplat", steps=30, eval_every=10)
    printed = capsys.readouterr().out
    assert printed.count("reused ") == 2 and "[1/" not in printed  # nothing trained
    assert run_files(out) == before  # records, specs (launch times), logs and renders untouched
    assert (out / "report.md").is_file()  # the report is rebuilt from the records
    again = json.loads((out / "report.json").read_text())
    assert again["runs"] == report["runs"] and again["verdict"] == report["verdict"]

    with pytest.raises(SystemExit) as exit_info:
        run_cpu_study(scene, out, baseline="bytesplat", steps=31, eval_every=10)
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and "holds a study with another set-up (--steps: 30 there, 31 now)" in err
    assert f"choose another --output, or delete {out} to start this study there" in err
    assert run_files(out) == before  # nothing deleted


@pytest.mark.slow
def test_failed_baseline_is_recorded_and_retains_it(scene, tmp_path, capsys):
    out = run_cpu_study(scene, tmp_path / "sf", baseline="splatfacto", steps=5, eval_every=5)
    report = json.loads((out / "report.json").read_text())
    baseline, candidate = report["runs"]
    assert baseline["method"] == "splatfacto" and baseline["status"] == "failed" and baseline["error"]
    assert candidate["status"] == "ok"  # the study went on
    assert report["verdict"] == RETAIN
    assert any(r.startswith("run failed: baseline splatfacto seed 42") for r in report["reasons"])
    assert "Error of baseline splatfacto" in (out / "report.md").read_text()

    # the same study again: the failed run is made again, the finished one is reused
    launched = {role: json.loads((out / run["run_dir"] / "spec.json").read_text())["launched_at"]
                for role, run in zip(("baseline", "candidate"), report["runs"])}  # fmt: skip
    capsys.readouterr()
    run_cpu_study(scene, out, baseline="splatfacto", steps=5, eval_every=5)
    printed = capsys.readouterr().out
    assert "[1/1] baseline splatfacto, seed 42, 5 steps on cpu; again: its earlier attempt failed" in printed
    assert "reused candidate bytesplat seed 42" in printed
    again = json.loads((out / "report.json").read_text())
    for role, run in zip(("baseline", "candidate"), again["runs"]):
        relaunched = json.loads((out / run["run_dir"] / "spec.json").read_text())["launched_at"] != launched[role]
        assert relaunched == (role == "baseline"), role
