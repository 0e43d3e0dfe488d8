"""systemd readiness notification (sd_notify) without libsystemd.

With ``Type=notify`` systemd passes ``NOTIFY_SOCKET`` (a path, or ``@name`` for the abstract
namespace); the service sends datagrams like ``READY=1`` to it. Outside systemd this is a no-op.
"""

from __future__ import annotations

import os
import socket


def notify(state: str, env: dict[str, str] | None = None) -> bool:
    """Send ``state`` (e.g. ``READY=1``) to systemd; False when not under systemd or it is gone.

    A notification that cannot be delivered is not an error worth dying for: the shim keeps
    serving kubelet whatever became of the notify socket.
    """
    address = (env if env is not None else os.environ).get("NOTIFY_SOCKET", "")
    if not address:
        return False
    if address.startswith("@"):
        address = "\0" + address[1:]
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
            sock.connect(address)
            sock.sendall(state.encode())
    except OSError:
        return False
    return True
