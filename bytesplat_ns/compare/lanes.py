"""GPU lanes of a study (`--devices`): which GPUs each lane has, which pairs each lane runs, the worker's
CUDA_VISIBLE_DEVICES, and the lanes run side by side (one thread each, each lane's runs one after another).

A lane is `--num-devices` consecutive GPUs of the `--devices` list; pair i runs on lane i % lanes, so the lanes
hold as even a number of pairs as there can be, and both runs of a pair use the same GPUs.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")


def parse_devices(text: str) -> list[int]:
    """The indices in text like 0,1 -> [0, 1]; raises ValueError naming the bad entry."""
    devices = []
    for part in text.split(","):
        entry = part.strip()
        if not entry.isdecimal():
            raise ValueError(f"--devices {text!r}: {entry!r} is not a GPU index; write indices like 0,1")
        devices.append(int(entry))
    return devices


def devices_problem(devices: Sequence[int], per_run: int, device: str, available: int) -> str | None:
    """Why `--devices` cannot be used as given, with the fix; None when it can.
    device: --device as given (auto, cpu or cuda); available: how many GPUs this process sees."""
    listed = ",".join(map(str, devices))
    if device == "cpu":
        return f"--devices {listed} picks GPUs, but --device is cpu: use --device cuda, or leave out --devices"
    if not available:
        return f"--devices {listed}: this process sees no GPU; leave out --devices to run on the CPU"
    if duplicates := sorted({d for d in devices if devices.count(d) > 1}):
        return f"--devices {listed} lists GPU {', '.join(map(str, duplicates))} more than once: list each GPU once"
    if unknown := [d for d in devices if d >= available]:
        return (
            f"--devices {listed}: no GPU {', '.join(map(str, unknown))} here; this process sees {available} GPU(s) "
            f"(0-{available - 1}): list only those"
        )
    if len(devices) < per_run:
        return f"--devices {listed} has fewer GPUs than --num-devices {per_run}: list more GPUs or lower --num-devices"
    if len(devices) % per_run:
        unused = ",".join(map(str, devices[len(devices) - len(devices) % per_run :]))
        return f"--devices {listed} would leave GPU {unused} unused with --num-devices {per_run}: list a multiple of it"
    return None


def plan_lanes(devices: Sequence[int], per_run: int) -> list[list[int]]:
    """The lanes' GPUs: consecutive groups of `per_run` from `devices` (a remainder smaller than that is unused)."""
    return [list(devices[i : i + per_run]) for i in range(0, len(devices) - per_run + 1, per_run)]


def lane_of_pair(pair: int, num_lanes: int) -> int:
    """The lane that runs pair `pair` (0-based)."""
    return pair % num_lanes


def cuda_visible_devices(gpus: Sequence[int], inherited: str | None) -> str:
    """CUDA_VISIBLE_DEVICES for a worker given `gpus`, numbered as this process sees them: through the
    CUDA_VISIBLE_DEVICES this process was started with (`inherited`), if any (e.g. "2,3": GPU 0 here is "2")."""
    if not inherited:
        return ",".join(map(str, gpus))
    visible = [entry.strip() for entry in inherited.split(",")]
    if unknown := [g for g in gpus if g >= len(visible)]:
        raise ValueError(f"GPU {unknown[0]} is not among CUDA_VISIBLE_DEVICES={inherited}")
    return ",".join(visible[g] for g in gpus)


def run_lanes(work: Sequence[Sequence[T]], run: Callable[[T], object]) -> None:
    """run(item) for every item: the lanes (one list of items each) side by side, each lane's items in order.
    On Ctrl-C (or an error) no further item starts; the ones in progress are waited for, then it is raised."""
    stop = threading.Event()

    def lane(items: Sequence[T]) -> None:
        for item in items:
            if stop.is_set():
                return
            run(item)

    with ThreadPoolExecutor(max_workers=max(1, len(work)), thread_name_prefix="lane") as pool:
        futures = [pool.submit(lane, items) for items in work]
        try:
            for future in futures:
                future.result()
        except BaseException as error:
            stop.set()  # leaving the with-block waits for the runs in progress
            if isinstance(error, KeyboardInterrupt):
                print("Interrupted: no further run starts; waiting for the runs in progress to end.", flush=True)
            raise
