"""Polling helper for tests that wait on real components."""

from __future__ import annotations

import time
from collections.abc import Callable


def wait_for(
    predicate: Callable[[], bool],
    timeout: float = 15.0,
    interval: float = 0.05,
    describe: Callable[[], object] | None = None,
) -> None:
    """Return once ``predicate()`` is true; fail the test after ``timeout`` seconds, saying what
    ``describe()`` returns then (the state that kept the condition false)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(interval)
    seen = f": {describe()!r}" if describe is not None else ""
    raise AssertionError(f"condition not met within {timeout}s{seen}")
