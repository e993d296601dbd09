"""A study's output folder across invocations: whether it can take the study, whether the study an earlier
invocation left there is this one (same set-up), and which of its runs are reused instead of trained again."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from bytesplat_ns.compare.records import RunRecord, RunSpec, StudyConfig

STUDY_FILE = "study.json"
"""Marks a folder as a study's output; written first, before any run."""
MAY_CHANGE = ("output", "run_timeout_s", "lanes")
"""StudyConfig fields that say only where the folder is and how runs are made: a study resumes whatever they are.
Every other field must be as before."""
OPTION_OF = {
    "data": "--data",
    "baseline": "--baseline",
    "candidate": "--candidate",
    "steps": "--steps",
    "seeds": "seeds (--seeds, --first-seed)",
    "eval_every": "--eval-every",
    "device": "--device",
    "num_devices": "--num-devices",
    "limits": "--limits",
    "extra_args": "ns-train options (after --)",
    "worse_db": "--worse-db",
}
"""StudyConfig field -> the bytesplat-compare option that sets it, as messages name it."""


def output_problem(output: Path) -> str | None:
    """Why the output folder cannot take a study: only a new or empty folder, or an earlier study's, can."""
    if output.exists() and not output.is_dir():
        return f"--output {output} is a file"
    if output.is_dir() and any(output.iterdir()) and not (output / STUDY_FILE).exists():
        return f"--output {output} is not empty and holds no earlier study ({STUDY_FILE}): choose a new folder"
    return None


def _shown(value: object) -> str:
    if isinstance(value, list):
        return " ".join(map(str, value)) or "(none)"
    return str(value)


def differences(earlier: StudyConfig, study: StudyConfig) -> list[str]:
    """What differs between two studies' set-ups, one line per option, ignoring MAY_CHANGE."""
    old, new = dataclasses.asdict(earlier), dataclasses.asdict(study)
    return [
        f"{OPTION_OF.get(name, name)}: {_shown(old[name])} there, {_shown(new[name])} now"
        for name in old
        if name not in MAY_CHANGE and old[name] != new[name]
    ]


def read_study(path: Path) -> StudyConfig:
    """A study.json as written by bytesplat-compare; raises ValueError when it cannot be read as one."""
    try:
        data = json.loads(path.read_text())
        known = {f.name for f in dataclasses.fields(StudyConfig)}
        return StudyConfig(**{k: v for k, v in data.items() if k in known})
    except (OSError, AttributeError, TypeError, ValueError) as error:
        raise ValueError(f"{path} cannot be read as a study ({error})") from error


def earlier_study_problem(output: Path, study: StudyConfig) -> str | None:
    """Why the study in `output` (if any) cannot be resumed as `study`, with the fix; None when it can or there is
    none. Nothing is deleted: a different study stays as it is."""
    path = output / STUDY_FILE
    if not path.exists():
        return None
    fix = f"choose another --output, or delete {output} to start this study there"
    try:
        earlier = read_study(path)
    except ValueError as error:
        return f"--output: {error}: {fix}"
    if changed := differences(earlier, study):
        return (
            f"--output {output} holds a study with another set-up ({'; '.join(changed)}): {fix}, "
            "or give the earlier options to resume it"
        )
    return None


def reusable(spec: RunSpec) -> tuple[RunRecord | None, str]:
    """The run's record from an earlier invocation when it can be reused (it trained every step and was evaluated);
    otherwise None and why it runs again ("" when it never started)."""
    run_dir = Path(spec.run_dir)
    path = run_dir / "record.json"
    if not path.exists():
        return None, "an earlier attempt did not finish" if run_dir.exists() else ""
    try:
        record = RunRecord.from_dict(json.loads(path.read_text()))
    except (OSError, AttributeError, TypeError, ValueError) as error:
        return None, f"its earlier record cannot be read ({error})"
    if (record.method, record.role, record.seed, record.pair) != (spec.method, spec.role, spec.seed, spec.pair):
        return None, f"its folder holds another run ({record.label})"
    if record.status != "ok":
        return None, "its earlier attempt failed"
    if record.steps != spec.steps:
        return None, f"its earlier attempt stopped after {record.steps} of {spec.steps} steps"
    return record, ""
