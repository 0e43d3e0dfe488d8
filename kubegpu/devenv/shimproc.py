"""Run ``kubegpu crishim`` as a child process (tests, benchmarks and the demo use this)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class ShimProcess:
    """A ``kubegpu crishim`` subprocess listening on ``socket`` and forwarding to ``runtime``."""

    socket: Path
    runtime_endpoint: str
    log_path: Path
    metrics_port: int = field(default_factory=free_port)
    extra_args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    # Put before the command, e.g. ``nsenter --mount=...`` to run inside a node's namespace.
    prefix: list[str] = field(default_factory=list)
    process: subprocess.Popen[bytes] | None = None

    @property
    def endpoint(self) -> str:
        return f"unix://{self.socket}"

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.metrics_port}"

    def command(self) -> list[str]:
        return [
            *self.prefix,
            sys.executable,
            "-m",
            "kubegpu",
            "crishim",
            "--listen",
            self.endpoint,
            "--runtime-endpoint",
            self.runtime_endpoint,
            "--metrics-address",
            f"127.0.0.1:{self.metrics_port}",
            *self.extra_args,
        ]

    def start(self, timeout: float = 20.0) -> ShimProcess:
        """Start the shim and wait for its systemd-style READY=1 notification.

        The shim is given NOTIFY_SOCKET, exactly as systemd's Type=notify does, so every start
        also exercises the readiness protocol the unit file relies on.
        """
        notify_path = self.socket.with_name(self.socket.name + ".notify")
        notify_path.unlink(missing_ok=True)
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as notify_socket:
            notify_socket.bind(str(notify_path))
            notify_socket.settimeout(0.1)
            log = self.log_path.open("ab")
            self.process = subprocess.Popen(
                self.command(),
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env={**os.environ, **self.env, "NOTIFY_SOCKET": str(notify_path)},
            )
            log.close()
            try:
                self._wait_ready(notify_socket, timeout)
            finally:
                notify_path.unlink(missing_ok=True)
        return self

    def _wait_ready(self, notify_socket: socket.socket, timeout: float) -> None:
        assert self.process is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if b"READY=1" in notify_socket.recv(4096).split(b"\n"):
                    return
            except TimeoutError:
                pass
            if self.process.poll() is not None:
                raise RuntimeError(f"crishim exited with {self.process.returncode}:\n{self.log_tail()}")
        raise RuntimeError(f"crishim sent no READY=1 within {timeout}s:\n{self.log_tail()}")

    def signal(self, signum: int) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signum)

    def kill(self) -> None:
        """SIGKILL: no cleanup at all, the socket file stays behind."""
        self.signal(signal.SIGKILL)
        self.wait(10)

    def wait(self, timeout: float) -> int:
        assert self.process is not None
        return self.process.wait(timeout=timeout)

    def stop(self) -> None:
        """SIGTERM, then SIGKILL if it does not exit in time."""
        if self.process is None or self.process.poll() is not None:
            return
        self.signal(signal.SIGTERM)
        try:
            self.wait(15)
        except subprocess.TimeoutExpired:
            self.kill()

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no crishim log)"


def sim_node_args(
    node: str, topology: str, state_dir: str | Path, keys_dir: str | Path | None = None
) -> list[str]:
    """Command-line options of a node agent with simulated devices (and, with keys, allocations)."""
    args = ["--device-plugin", "sim", "--sim-topology", topology, "--node-name", node,
            "--sim-state-dir", str(state_dir)]
    if keys_dir is not None:
        args += ["--allocation-keys-dir", str(keys_dir)]
    return args
