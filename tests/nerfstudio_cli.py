"""Run nerfstudio's command-line tools (installed beside this Python) from tests."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def ns(tool: str, *args: str, check: bool = True, timeout: float = 900) -> subprocess.CompletedProcess:
    exe = Path(sys.executable).with_name(tool)
    proc = subprocess.run([str(exe), *args], capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"{tool} {' '.join(args)} exited {proc.returncode}:\n{proc.stdout[-4000:]}\n{proc.stderr[-6000:]}")
    return proc
