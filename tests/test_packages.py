"""Packages counted as hwloc counts them (issue #9 item 5): from the package masks when
``physical_package_id`` cannot be trusted, from the id when the masks are missing."""

from __future__ import annotations

from pathlib import Path

from discovery.fidelity import to_fidelity
from discovery.host import discover_host
from discovery.root import Root


def cpu_tree(root: Path, package_ids: list[int], masks: list[str] | None, key: str) -> Path:
    """A minimal sysfs with one CPU per entry of ``package_ids`` (single-thread cores)."""
    base = root / "sys/devices/system/cpu"
    n = len(package_ids)
    (base).mkdir(parents=True)
    (base / "online").write_text(f"0-{n - 1}\n")
    for cid, pkg in enumerate(package_ids):
        topo = base / f"cpu{cid}" / "topology"
        topo.mkdir(parents=True)
        (topo / "physical_package_id").write_text(f"{pkg}\n")
        (topo / "core_id").write_text("0\n")
        (topo / "thread_siblings_list").write_text(f"{cid}\n")
        if masks is not None:
            (topo / key).write_text(masks[cid] + "\n")
    return root


def packages(root: Path) -> int | None:
    inv, _ = discover_host(Root(root, live=False))
    count: int | None = to_fidelity(inv)["packages"]
    return count


def test_s390x_ids_of_minus_one_use_the_masks(tmp_path: Path) -> None:
    root = cpu_tree(tmp_path, [-1, -1, -1, -1], ["0-1", "0-1", "2-3", "2-3"], "core_siblings_list")
    assert packages(root) == 2


def test_shared_id_with_disjoint_masks_counts_each_socket(tmp_path: Path) -> None:
    """Itanium-style dumps: single-core sockets all saying package 0."""
    root = cpu_tree(tmp_path, [0, 0, 0, 0], ["0", "1", "2", "3"], "package_cpus_list")
    assert packages(root) == 4


def test_consistent_ids_are_kept(tmp_path: Path) -> None:
    root = cpu_tree(tmp_path, [3, 3, 7, 7], ["0-1", "0-1", "2-3", "2-3"], "package_cpus_list")
    inv, _ = discover_host(Root(root, live=False))
    assert [c.package for c in inv.cpus] == [3, 3, 7, 7]


def test_without_masks_the_id_decides(tmp_path: Path) -> None:
    root = cpu_tree(tmp_path, [0, 0, 1, 1], None, "")
    assert packages(root) == 2
