"""Run the CRI shim: listen on a unix socket, forward to the runtime, stop cleanly on SIGTERM.

Lifecycle: prepare the socket path (refuse to steal a live socket, replace a stale one), serve
with mode 0660, tell systemd READY=1, and on SIGTERM/SIGINT stop accepting, let in-flight calls
finish for up to ``drain_seconds``, then exit. The runtime connection reconnects by itself, so
while containerd is down calls fail with UNAVAILABLE and succeed again once it is back.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import signal
import socket
import stat
from dataclasses import dataclass
from pathlib import Path

import grpc
import grpc.aio

from crishim.cri import api_pb2, api_pb2_grpc
from crishim.gpumetrics import GpuMetricsCollector, GpuTelemetrySampler
from crishim.intercept import Interceptor, PassthroughInterceptor
from crishim.metrics import ShimMetrics
from crishim.proxy import ForwardingHandler
from crishim.sdnotify import notify
from kubegpu.httpserve import MetricsServer
from kubegpu.logs import log_event

log = logging.getLogger("kubegpu.crishim")

SOCKET_MODE = 0o660
# kubelet's own CRI client allows 16 MiB messages; the proxy must never be the tighter limit.
UNLIMITED = -1
CHANNEL_OPTIONS: list[tuple[str, int]] = [
    ("grpc.max_send_message_length", UNLIMITED),
    ("grpc.max_receive_message_length", UNLIMITED),
    # Reconnect quickly after a containerd restart instead of gRPC's default of up to 120 s.
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
    ("grpc.enable_retries", 0),
    ("grpc.http2.bdp_probe", 0),
]
SERVER_OPTIONS: list[tuple[str, int]] = [
    ("grpc.max_send_message_length", UNLIMITED),
    ("grpc.max_receive_message_length", UNLIMITED),
    # No bandwidth-delay probes: a PING per burst of received data, and one more wakeup of the
    # shim's threads per call, to size flow-control windows for links far slower than a unix
    # socket (docs/performance.md, "What the shim costs a node").
    ("grpc.http2.bdp_probe", 0),
]


class ShimConfigError(RuntimeError):
    """The shim cannot start with the configuration it was given."""


@dataclass
class ShimConfig:
    """What ``kubegpu crishim`` was asked to do (see docs/crishim.md for the flags)."""

    listen: str = "unix:///run/kubegpu/crishim.sock"
    runtime_endpoint: str = "unix:///run/containerd/containerd.sock"
    metrics_address: str | None = None
    drain_seconds: float = 5.0
    health_interval: float = 10.0
    ready_wait_seconds: float = 10.0


def unix_path(endpoint: str) -> Path:
    """The filesystem path of a ``unix://`` endpoint (``unix:/p`` and bare paths too)."""
    if endpoint.startswith("unix://"):
        return Path(endpoint[len("unix://") :])
    if endpoint.startswith("unix:"):
        return Path(endpoint[len("unix:") :])
    if endpoint.startswith("/"):
        return Path(endpoint)
    raise ShimConfigError(f"not a unix socket endpoint: {endpoint!r}")


def grpc_target(endpoint: str) -> str:
    """The gRPC target string for a unix endpoint."""
    return f"unix:{unix_path(endpoint)}"


def socket_is_live(path: Path) -> bool:
    """True when something accepts connections on the unix socket at ``path``."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(1.0)
        try:
            probe.connect(str(path))
        except OSError as exc:
            if exc.errno in (errno.ECONNREFUSED, errno.ENOENT):
                return False
            raise
        return True


def prepare_socket_path(path: Path) -> None:
    """Create the parent directory and remove a stale socket; refuse a live one or a non-socket."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        mode = path.lstat().st_mode
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(mode):
        raise ShimConfigError(f"{path} exists and is not a socket; refusing to replace it")
    if socket_is_live(path):
        raise ShimConfigError(f"{path} is served by another process (is a shim already running?)")
    path.unlink()
    log_event(log, "socket.stale_removed", path=str(path))


class CriShim:
    """One running shim: gRPC server, runtime channel, metrics endpoint."""

    def __init__(
        self,
        config: ShimConfig,
        interceptor: Interceptor | None = None,
        telemetry: GpuTelemetrySampler | None = None,
    ) -> None:
        self.config = config
        self.telemetry = telemetry  # per-GPU live metrics on /metrics (crishim.gpumetrics)
        self.socket_path = unix_path(config.listen)
        self.metrics = ShimMetrics()
        self._interceptor: Interceptor = interceptor or PassthroughInterceptor()
        self._channel: grpc.aio.Channel | None = None
        self._server: grpc.aio.Server | None = None
        self._metrics_server: MetricsServer | None = None
        self._serving = False
        self._tasks: list[asyncio.Task[None]] = []

    async def start(self) -> None:
        """Bind the socket (mode 0660), connect to the runtime and start serving."""
        prepare_socket_path(self.socket_path)
        self._channel = grpc.aio.insecure_channel(
            grpc_target(self.config.runtime_endpoint), options=CHANNEL_OPTIONS
        )
        self._server = grpc.aio.server(options=SERVER_OPTIONS)
        self._server.add_generic_rpc_handlers(
            [ForwardingHandler(self._channel, self.metrics, self._interceptor)]
        )
        self._tasks = self._interceptor.start(self._channel, self.config.health_interval)
        if self.telemetry is not None:
            self.telemetry.attach(self._sandbox_names)
            self.metrics.registry.register(GpuMetricsCollector(self.telemetry))
            self._tasks.append(asyncio.create_task(self.telemetry.run()))
        old_umask = os.umask(0o117)  # the socket is born 0660, never briefly world-writable
        try:
            self._server.add_insecure_port(f"unix:{self.socket_path}")
            await self._server.start()
        finally:
            os.umask(old_umask)
        os.chmod(self.socket_path, SOCKET_MODE)
        await self._wait_interceptor_ready()
        if self.config.metrics_address:
            self._metrics_server = MetricsServer(
                self.config.metrics_address,
                self.metrics.render,
                {"/healthz": self.healthz, "/readyz": self.readyz},
            )
            self._metrics_server.start()
        self._serving = True
        log_event(
            log,
            "crishim.serving",
            listen=str(self.socket_path),
            runtime=self.config.runtime_endpoint,
            metrics=self.config.metrics_address,
        )

    async def _wait_interceptor_ready(self) -> None:
        """Give the interceptor's startup work (the ledger rebuild) a moment before READY=1.

        Bounded: with containerd down the rebuild retries in the background and calls that need
        the ledger get UNAVAILABLE until it is done, while everything else is served.
        """
        try:
            await asyncio.wait_for(self._interceptor.ready(), timeout=self.config.ready_wait_seconds)
        except TimeoutError:
            log_event(
                log,
                "crishim.ready_without_ledger",
                logging.WARNING,
                waited_seconds=self.config.ready_wait_seconds,
            )

    async def _sandbox_names(self, ids: set[str]) -> dict[str, tuple[str, str]]:
        """Sandbox id -> (namespace, pod name), from the runtime, for the ids asked."""
        assert self._channel is not None
        stub = api_pb2_grpc.RuntimeServiceStub(self._channel)
        listing = await stub.ListPodSandbox(api_pb2.ListPodSandboxRequest(), timeout=10)
        return {s.id: (s.metadata.namespace, s.metadata.name) for s in listing.items if s.id in ids}

    def healthz(self) -> tuple[bool, str]:
        """The shim process serves CRI calls."""
        return (self._serving, "ok" if self._serving else "not serving")

    def readyz(self) -> tuple[bool, str]:
        """The shim serves and its runtime connection is up."""
        if not self._serving or self._channel is None:
            return (False, "not serving")
        state = self._channel.get_state(try_to_connect=True)
        ready = state is grpc.ChannelConnectivity.READY
        return (ready, f"runtime {state.name.lower()}")

    @property
    def metrics_port(self) -> int | None:
        return self._metrics_server.port if self._metrics_server else None

    async def stop(self) -> None:
        """Stop accepting calls, drain in-flight ones for up to drain_seconds, then close."""
        self._serving = False
        if self._server is not None:
            await self._server.stop(self.config.drain_seconds)
        for task in self._tasks:
            task.cancel()
        if self._channel is not None:
            await self._channel.close()
        if self._metrics_server is not None:
            self._metrics_server.stop()
        with contextlib.suppress(FileNotFoundError):
            self.socket_path.unlink()
        log_event(log, "crishim.stopped", listen=str(self.socket_path))


async def serve(
    config: ShimConfig, interceptor: Interceptor | None = None, telemetry: GpuTelemetrySampler | None = None
) -> None:
    """Run a shim until SIGTERM or SIGINT, notifying systemd once it serves."""
    shim = CriShim(config, interceptor, telemetry)
    try:
        await shim.start()
    except BaseException:
        await shim.stop()  # what started (the gRPC server, the socket) goes away with the failure
        raise
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    try:
        notify("READY=1")
        await stop.wait()
        log_event(log, "crishim.draining", drain_seconds=config.drain_seconds)
        notify("STOPPING=1")
    finally:
        await shim.stop()
