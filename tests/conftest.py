"""Root conftest: loads the fixture modules that start real components."""

pytest_plugins = [
    "tests.fixtures.containerd",
    "tests.fixtures.cluster",
    "tests.fixtures.localcluster",
    "tests.fixtures.image",
    "tests.fixtures.helm",
    "tests.fixtures.schedulerpods",
]
