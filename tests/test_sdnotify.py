"""sd_notify: the datagram systemd's Type=notify waits for."""

from __future__ import annotations

import socket
from pathlib import Path

from crishim.sdnotify import notify


def test_ready_reaches_a_path_socket(tmp_path: Path) -> None:
    path = tmp_path / "notify"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as receiver:
        receiver.bind(str(path))
        assert notify("READY=1", {"NOTIFY_SOCKET": str(path)}) is True
        assert receiver.recv(64) == b"READY=1"


def test_ready_reaches_an_abstract_socket() -> None:
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as receiver:
        receiver.bind("\0kubegpu-test-notify")
        assert notify("READY=1", {"NOTIFY_SOCKET": "@kubegpu-test-notify"}) is True
        assert receiver.recv(64) == b"READY=1"


def test_no_systemd_and_vanished_socket_are_not_errors(tmp_path: Path) -> None:
    assert notify("READY=1", {}) is False
    assert notify("READY=1", {"NOTIFY_SOCKET": str(tmp_path / "gone")}) is False
