"""bytesplat-compare: limits, verdict and paired statistics on hand-made records; two short CPU studies end to end."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from bytesplat_ns.compare.cli import main
from bytesplat_ns.compare.limits import KEEP, RETAIN, Limit, decide, parse_limits
from bytesplat_ns.compare.records import CurvePoint, RunRecord, RunSpec, StudyConfig, ViewMetrics
from bytesplat_ns.compare.report import write_report
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

    clock = TrainingClock(spec, 0, lambda: slow_evaluation(False), lambda: slow_evaluation(True))
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


# -- short CPU studies ----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def scene(tmp_path_factory) -> Path:
    return generate_demo_scene(tmp_path_factory.mktemp("compare") / "scene", SCENE)


PER_RUN_FIELDS = ("psnr", "ssim", "lpips", "startup_s", "train_s", "eval_s", "step_ms", "peak_mem", "splats",
                  "bytes_exchanged", "time_to_target", "curve", "views", "heldout_views", "config")  # fmt: skip


def run_cpu_study(scene, out, baseline: str, steps: int, eval_every: int):
    """One seed, bytesplat as the candidate, on the CPU; returns the output folder."""
    main(["--data", str(scene), "--baseline", baseline, "--candidate", "bytesplat", "--steps", str(steps),
          "--seeds", "1", "--eval-every", str(eval_every), "--device", "cpu", "--output", str(out),
          "--", "--pipeline.model.num-downscales", "0"])  # fmt: skip
    return out


@pytest.mark.slow
def test_a_a_study_end_to_end(scene, tmp_path):
    out = run_cpu_study(scene, tmp_path / "aa", baseline="bytesplat", steps=30, eval_every=10)
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


@pytest.mark.slow
def test_failed_baseline_is_recorded_and_retains_it(scene, tmp_path):
    out = run_cpu_study(scene, tmp_path / "sf", baseline="splatfacto", steps=5, eval_every=5)
    report = json.loads((out / "report.json").read_text())
    baseline, candidate = report["runs"]
    assert baseline["method"] == "splatfacto" and baseline["status"] == "failed" and baseline["error"]
    assert candidate["status"] == "ok"  # the study went on
    assert report["verdict"] == RETAIN
    assert any(r.startswith("run failed: baseline splatfacto seed 42") for r in report["reasons"])
    assert "Error of baseline splatfacto" in (out / "report.md").read_text()
