"""Each rank on a machine gets its own CPU cores.

A training step is bound by the host (Python and kernel launches), so a rank runs only as fast as the core
its main thread lands on. Left alone, the OS moves every rank's threads over all cores, and two ranks' busy
threads end up sharing a physical core (hyper-thread siblings) or bouncing between sockets. Pinning gives
local rank r the r-th share of the physical cores (all hyper-threads of each, whole sockets kept together
where the share allows) and a torch thread pool of that size.
"""

from __future__ import annotations

import os
from pathlib import Path

CPU_ROOT = Path("/sys/devices/system/cpu")


def physical_cores(cpus: list[int], root: Path = CPU_ROOT) -> list[list[int]]:
    """Logical CPUs grouped by physical core, cores ordered by (socket, core id); one group per CPU where the
    topology cannot be read."""
    cores: dict[tuple[int, int], list[int]] = {}
    for cpu in cpus:
        topology = root / f"cpu{cpu}" / "topology"
        try:
            key = (int((topology / "physical_package_id").read_text()), int((topology / "core_id").read_text()))
        except (OSError, ValueError):
            key = (0, 1_000_000 + cpu)
        cores.setdefault(key, []).append(cpu)
    return [sorted(group) for _, group in sorted(cores.items())]


def cpu_share(cpus: list[int], local_rank: int, local_ranks: int, root: Path = CPU_ROOT) -> list[int]:
    """The logical CPUs of `local_rank`'s share: disjoint between local ranks, together all of `cpus` (a rank
    gets at least one core; with more ranks than cores, ranks share round-robin)."""
    cores = physical_cores(cpus, root)
    if local_ranks > len(cores):
        return cores[local_rank % len(cores)]
    per_rank, extra = divmod(len(cores), local_ranks)
    start = local_rank * per_rank + min(local_rank, extra)
    size = per_rank + (1 if local_rank < extra else 0)
    return [cpu for core in cores[start : start + size] for cpu in core]


def pin_to_cpu_share(local_rank: int, local_ranks: int) -> list[int]:
    """Bind this process to its share of the CPUs it may use; returns the share."""
    share = cpu_share(sorted(os.sched_getaffinity(0)), local_rank, local_ranks)
    os.sched_setaffinity(0, share)
    return share
