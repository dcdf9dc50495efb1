"""The ``e2e`` tier: one real control plane per session (tests/e2e/cluster.py).

Run it with ``python3 -m pytest -m e2e -p no:xdist``; without the binaries every test is
skipped with :data:`cluster.SKIP_REASON`. Each module sets ``pytestmark = pytest.mark.e2e``
and removes what it creates (namespaces, slices, CRDs, nodes), with node names unique
to the module.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator

import pytest

from tests.e2e.cluster import SKIP_REASON, Cluster, find_assets


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    assets = find_assets()
    if assets is None:
        pytest.skip(SKIP_REASON)
    if shutil.which("openssl") is None:
        pytest.skip("the e2e tier makes its certificates with openssl: install it")
    c = Cluster.start(tmp_path_factory.mktemp("cluster"), assets)
    try:
        yield c
    finally:
        c.stop()
