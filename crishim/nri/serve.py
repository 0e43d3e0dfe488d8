"""Run the node agent's NRI front: stay registered with containerd, serve /metrics and probes.

``serve_nri`` connects a ``PluginSession`` (crishim/nri/plugin.py) with the ``NriAgent`` handlers
to containerd's NRI socket and keeps it connected: when containerd restarts or drops the plugin,
the session ends and a new one is connected (after ``RECONNECT_SECONDS``, doubling up to
``RECONNECT_MAX_SECONDS`` while it fails); each new session's ``Synchronize`` rebuilds the ledger.
While no session is up, containerd (with the plugin required, docs/nri.md) creates no container
at all. Device health and rediscovery run beside it, as in the CRI proxy. systemd gets READY=1
after the first Synchronize; SIGTERM and SIGINT end the session and the process.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from dataclasses import dataclass
from pathlib import Path

from crishim.gpumetrics import GpuMetricsCollector, GpuTelemetrySampler
from crishim.metrics import ShimMetrics
from crishim.nri.agent import NriAgent
from crishim.nri.plugin import DEFAULT_SOCKET, PluginSession
from crishim.sdnotify import notify
from kubegpu.httpserve import MetricsServer
from kubegpu.logs import log_event

log = logging.getLogger("kubegpu.nri")
RECONNECT_SECONDS = 0.5
RECONNECT_MAX_SECONDS = 10.0


@dataclass
class NriConfig:
    """What ``kubegpu crishim --front nri`` was asked to do (docs/nri.md for the flags)."""

    socket: Path = DEFAULT_SOCKET
    plugin_name: str = "kubegpu"
    plugin_index: str = "10"
    metrics_address: str | None = None
    health_interval: float = 10.0


class NriFront:
    """One running NRI front: the plugin session (reconnected), device upkeep, metrics."""

    def __init__(
        self, config: NriConfig, agent: NriAgent, telemetry: GpuTelemetrySampler | None = None
    ) -> None:
        self.config = config
        self.agent = agent
        self.telemetry = telemetry
        self.metrics = ShimMetrics()
        self.session: PluginSession | None = None
        self.synchronized = asyncio.Event()  # the first session has synchronized
        self._stop = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._metrics_server: MetricsServer | None = None

    def healthz(self) -> tuple[bool, str]:
        return (not self._stop.is_set(), "ok" if not self._stop.is_set() else "stopping")

    def readyz(self) -> tuple[bool, str]:
        session = self.session
        live = session is not None and session.synchronized.is_set() and not session.closed
        return (live, "registered with containerd" if live else "not registered with containerd")

    async def start(self) -> None:
        rewriter = self.agent.rewriter
        self._tasks.append(asyncio.create_task(rewriter.maintain_devices(self.config.health_interval)))
        if self.telemetry is not None:
            self.metrics.registry.register(GpuMetricsCollector(self.telemetry))
            self._tasks.append(asyncio.create_task(self.telemetry.run()))
        self._tasks.append(asyncio.create_task(self._stay_connected()))
        if self.config.metrics_address:
            probes = {"/healthz": self.healthz, "/readyz": self.readyz}
            self._metrics_server = MetricsServer(self.config.metrics_address, self.metrics.render, probes)
            self._metrics_server.start()

    async def _stay_connected(self) -> None:
        wait = RECONNECT_SECONDS
        while not self._stop.is_set():
            session = PluginSession(
                self.agent,
                socket=self.config.socket,
                name=self.config.plugin_name,
                index=self.config.plugin_index,
            )
            self.session = session
            try:
                await session.connect()
                await asyncio.wait_for(session.synchronized.wait(), timeout=30)
            except Exception as error:  # no socket yet, refused registration, containerd gone mid-way
                log_event(
                    log,
                    "nri.connect_failed",
                    logging.WARNING,
                    socket=str(self.config.socket),
                    error=str(error)[:200],
                    retry_in_seconds=wait,
                )
                await session.close()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stop.wait(), timeout=wait)
                wait = min(RECONNECT_MAX_SECONDS, wait * 2)
                continue
            wait = RECONNECT_SECONDS
            self.synchronized.set()
            log_event(log, "nri.registered", socket=str(self.config.socket), plugin=self.config.plugin_name)
            reason = await session.wait_closed()
            await session.close()
            if not self._stop.is_set():
                log_event(log, "nri.disconnected", logging.WARNING, reason=reason[:200])

    async def stop(self) -> None:
        self._stop.set()
        if self.session is not None:
            await self.session.close()
        for task in self._tasks:
            task.cancel()
        if self._metrics_server is not None:
            self._metrics_server.stop()
        log_event(log, "nri.stopped", socket=str(self.config.socket))


async def serve_nri(
    config: NriConfig, agent: NriAgent, telemetry: GpuTelemetrySampler | None = None
) -> None:
    """Run the NRI front until SIGTERM or SIGINT, notifying systemd once registered."""
    front = NriFront(config, agent, telemetry)
    await front.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    try:
        ready = asyncio.ensure_future(front.synchronized.wait())
        stopping = asyncio.ensure_future(stop.wait())
        await asyncio.wait({ready, stopping}, return_when=asyncio.FIRST_COMPLETED)
        ready.cancel()
        if not stop.is_set():
            notify("READY=1")
        await stopping
        notify("STOPPING=1")
    finally:
        await front.stop()
