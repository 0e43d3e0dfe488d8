"""Root conftest: loads the fixture modules that start real components; every test starts with the
scheduling core's process-wide link-matrix memo empty."""

import pytest

pytest_plugins = [
    "tests.fixtures.containerd",
    "tests.fixtures.cluster",
    "tests.fixtures.localcluster",
    "tests.fixtures.image",
    "tests.fixtures.helm",
    "tests.fixtures.schedulerpods",
]


@pytest.fixture(autouse=True)
def _fresh_link_matrices():
    """Every test computes its own GPU-set decisions: the scheduling core shares one LinkMatrix
    (with its memoised scores and choices) between nodes of identical links, process-wide. Left
    across tests, a decision computed by an earlier test would be a dictionary lookup in a later
    one, so the later test would not exercise (and mutation testing would not map it to) the code
    that decides."""
    from scheduler.core import topology

    for matrix in topology._SHARED.values():
        matrix.memo.clear()
        matrix._values = None
        matrix._exact.clear()
        matrix._partition.clear()
    topology._SHARED.clear()
    topology._BY_TOPOLOGY.clear()
    yield
