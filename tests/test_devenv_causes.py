"""Known host limits named when a daemon exits early (kubegpu.devenv.controlplane.known_cause)."""

from __future__ import annotations

from kubegpu.devenv.controlplane import known_cause


def test_exhausted_inotify_instances_are_named_with_the_fix() -> None:
    log = 'E1126 kubelet.go:1833] "Failed to start cAdvisor" err="inotify_init: too many open files"'
    cause = known_cause(log)
    assert cause is not None
    assert "fs.inotify.max_user_instances=" in cause and "sysctl -w" in cause


def test_fsnotify_spelling_is_recognised_too() -> None:
    log = 'err="error creating fsnotify watcher: too many open files"'
    assert known_cause(log) is not None


def test_other_failures_get_no_guess() -> None:
    assert known_cause('err="too many open files" while reading a socket') is None
    assert known_cause("failed to load config: no such file") is None
    assert known_cause("") is None
