"""Run one training of a study in a fresh worker process and collect its record (or its failure)."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

from bytesplat_ns.compare.lanes import cuda_visible_devices
from bytesplat_ns.compare.records import RunRecord, RunSpec, write_json

ERROR_LINES = 15
"""How many of a failed run's last output lines its record keeps."""
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def worker_env(spec: RunSpec) -> tuple[dict[str, str], list[str]]:
    """Environment of the worker process, and notes on what was changed in it."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    notes = []
    if spec.gpus is not None:
        env["CUDA_VISIBLE_DEVICES"] = cuda_visible_devices(spec.gpus, os.environ.get("CUDA_VISIBLE_DEVICES"))
    if spec.method.startswith("splatfacto") and spec.device.startswith("cuda"):
        # splatfacto's torch.compile warm-up would be counted as its start-up and first steps
        env["TORCHDYNAMO_DISABLE"] = "1"
        notes.append("TORCHDYNAMO_DISABLE=1 (splatfacto's torch.compile skipped)")
    return env, notes


def error_tail(log: Path, lines: int = ERROR_LINES) -> str:
    """The last non-empty lines of a log, without terminal colour codes."""
    if not log.exists():
        return "(no output)"
    text = _ANSI.sub("", log.read_text(errors="replace"))
    kept = [line.rstrip() for line in text.splitlines() if line.strip()]
    return "\n".join(kept[-lines:]) or "(no output)"


def run_one(spec: RunSpec, timeout_s: float | None = None) -> RunRecord:
    """Train one run in its own process; a failure (exit status, missing record, timeout) becomes a failed record."""
    run_dir = Path(spec.run_dir)
    if run_dir.exists():
        shutil.rmtree(run_dir)  # this run's earlier attempt, failed or unfinished (resume.reusable said so)
    run_dir.mkdir(parents=True)
    env, notes = worker_env(spec)
    log = run_dir / "log.txt"
    spec_path = run_dir / "spec.json"
    started = time.time()
    spec = dataclasses.replace(spec, launched_at=started)
    write_json(spec_path, dataclasses.asdict(spec))
    command = [sys.executable, "-m", "bytesplat_ns.compare.worker", str(spec_path)]
    with open(log, "w") as out:
        try:
            returncode = subprocess.run(
                command, stdout=out, stderr=subprocess.STDOUT, env=env, timeout=timeout_s
            ).returncode
            timed_out = False
        except subprocess.TimeoutExpired:
            returncode, timed_out = -1, True
    wall_s = time.time() - started

    record_path = run_dir / "record.json"
    output = Path(spec.output_dir)
    if returncode == 0 and record_path.exists():
        record = RunRecord.from_dict(json.loads(record_path.read_text()))
    else:
        why = f"timed out after {timeout_s:.0f} s" if timed_out else f"worker exited with status {returncode}"
        record = RunRecord(
            method=spec.method,
            role=spec.role,
            seed=spec.seed,
            pair=spec.pair,
            status="failed",
            error=f"{why}; last output:\n{error_tail(log)}",
            run_dir=str(run_dir.relative_to(output)),
            device=spec.device,
        )
    record.wall_s = wall_s
    record.gpus = spec.gpus
    record.notes = [*notes, *record.notes]
    write_json(record_path, record.to_dict())
    return record
