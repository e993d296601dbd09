"""Run nerfstudio's command-line tools (installed beside this Python) from tests."""

from __future__ import annotations

import subprocess

from bytesplat_ns.demo import ns_tool


def ns(tool: str, *args: str, check: bool = True, timeout: float = 900) -> subprocess.CompletedProcess:
    proc = subprocess.run([ns_tool(tool), *args], capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(
            f"{tool} {' '.join(args)} exited {proc.returncode}:\n{proc.stdout[-4000:]}\n{proc.stderr[-6000:]}"
        )
    return proc
