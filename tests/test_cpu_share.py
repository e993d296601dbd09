"""CPU shares of the ranks on one machine: disjoint, covering, whole physical cores, sockets kept together."""

from __future__ import annotations

import pytest

from bytesplat_ns.cpu_share import cpu_share, physical_cores


def fake_topology(root, sockets: int, cores: int, threads: int) -> list[int]:
    """sysfs of a machine numbering logical CPUs like Linux on x86: thread t of core c of socket s is
    t * (sockets * cores) + s * cores + c."""
    cpus = []
    for t in range(threads):
        for s in range(sockets):
            for c in range(cores):
                cpu = t * sockets * cores + s * cores + c
                topology = root / f"cpu{cpu}" / "topology"
                topology.mkdir(parents=True)
                (topology / "physical_package_id").write_text(f"{s}\n")
                (topology / "core_id").write_text(f"{c}\n")
                cpus.append(cpu)
    return sorted(cpus)


@pytest.mark.parametrize("ranks", [1, 2, 3, 4, 8])
def test_shares_are_disjoint_whole_cores_and_cover_the_machine(tmp_path, ranks):
    cpus = fake_topology(tmp_path, sockets=2, cores=4, threads=2)
    shares = [cpu_share(cpus, r, ranks, root=tmp_path) for r in range(ranks)]
    flat = [cpu for share in shares for cpu in share]
    assert sorted(flat) == cpus and len(set(flat)) == len(flat)
    cores = physical_cores(cpus, root=tmp_path)
    for share in shares:  # a rank owns both hyper-threads of each of its cores
        assert all(set(core) <= set(share) or not set(core) & set(share) for core in cores)
    if ranks == 2:  # one socket each
        assert sorted(shares[0]) == [0, 1, 2, 3, 8, 9, 10, 11] and sorted(shares[1]) == [4, 5, 6, 7, 12, 13, 14, 15]


def test_more_ranks_than_cores_share_round_robin(tmp_path):
    cpus = fake_topology(tmp_path, sockets=1, cores=2, threads=1)
    assert [cpu_share(cpus, r, 3, root=tmp_path) for r in range(3)] == [[0], [1], [0]]


def test_unreadable_topology_splits_the_cpus_in_order(tmp_path):
    assert [cpu_share([0, 1, 2, 3, 4], r, 2, root=tmp_path) for r in range(2)] == [[0, 1, 2], [3, 4]]
