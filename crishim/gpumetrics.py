"""Per-GPU live metrics on the node agent's ``/metrics``, named as NVIDIA's DCGM exporter names them.

``GpuTelemetrySampler`` reads every plugin's telemetry (``devices.telemetry``) every ``interval``
seconds off the event loop (a read stuck past ``read_timeout`` is logged and waited on by the
next rounds, never started again beside itself), keeps a moving average per GPU, and works out
which pods' containers hold each GPU (the node ledger's holdings; pod namespace and name from
containerd's sandboxes). ``sampled_at`` is when its last good round was read: the metrics
publisher (``crishim.metricspublisher``) writes that round for the scheduler.
``GpuMetricsCollector`` turns the last round into Prometheus families on the shim's registry, so
Grafana dashboards built for dcgm-exporter work unchanged:

| metric | unit | from |
| --- | --- | --- |
| ``DCGM_FI_DEV_GPU_UTIL`` | % | utilisation (last reading) |
| ``DCGM_FI_DEV_FB_USED`` / ``DCGM_FI_DEV_FB_FREE`` | MiB | memory in use / free |
| ``DCGM_FI_DEV_GPU_TEMP`` | °C | temperature, where the GPU reports it |
| ``DCGM_FI_DEV_POWER_USAGE`` | W | power draw, where reported |
| ``DCGM_FI_DEV_ECC_DBE_VOL_TOTAL`` | count | uncorrectable ECC errors since the driver loaded |
| ``DCGM_FI_DEV_XID_ERRORS`` | code | the last XID error, where read |
| ``kubegpu_gpu_utilization_average`` | % | the moving average the scheduler uses |
| ``kubegpu_gpu_lost`` | 0/1 | the driver lost the GPU |

Labels as dcgm-exporter's: ``gpu`` (index), ``UUID``, ``device`` (``nvidia<index>``),
``modelName``, ``Hostname`` (the node) and, when a container holds the GPU, ``namespace``,
``pod``, ``container``; a GPU shared by several containers has one series per container, and a
free GPU one series with those three labels empty. A field the GPU cannot report has no series.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from crishim.ledger import Holding
from devices.model import Device, DeviceKind
from devices.plugin import DevicePlugin
from devices.telemetry import GpuTelemetry, Smoother
from kubegpu.logs import log_event

log = logging.getLogger("kubegpu.crishim.gpumetrics")

READ_TIMEOUT = 10.0  # seconds a round waits for the plugins' readings before it reports them stuck
DEFAULT_INTERVAL = 15.0  # seconds between samples (dcgm-exporter's default collection is 30 s)
LABELS = ("gpu", "UUID", "device", "modelName", "Hostname", "namespace", "pod", "container")

# Sandbox id -> (namespace, pod name) for the sandboxes the holdings name.
SandboxNames = Callable[[set[str]], Awaitable[Mapping[str, tuple[str, str]]]]


@dataclass(frozen=True)
class GpuRow:
    """One GPU's last round: its identity, its readings, who holds it."""

    device: Device
    latest: GpuTelemetry
    average: GpuTelemetry
    holders: tuple[tuple[str, str, str], ...]  # (namespace, pod, container)


def telemetry_of(plugins: Iterable[DevicePlugin]) -> dict[str, GpuTelemetry]:
    """Every plugin's readings that has ``telemetry()`` (the later plugin wins an id, as in discovery)."""
    readings: dict[str, GpuTelemetry] = {}
    for plugin in plugins:
        read = getattr(plugin, "telemetry", None)
        if read is not None:
            readings.update(read())
    return readings


def holders_by_device(
    holdings: Iterable[Holding], names: Mapping[str, tuple[str, str]]
) -> dict[str, tuple[tuple[str, str, str], ...]]:
    """device id -> (namespace, pod, container) of each container holding it (sorted, unique)."""
    found: dict[str, set[tuple[str, str, str]]] = {}
    for holding in holdings:
        namespace, pod = names.get(holding.sandbox_id, ("", holding.pod_uid))
        found.setdefault(holding.device, set()).add((namespace, pod, holding.container))
    return {device: tuple(sorted(who)) for device, who in found.items()}


class GpuTelemetrySampler:
    """Samples the plugins' telemetry on a schedule and keeps the last round (``rows``)."""

    def __init__(
        self,
        node_name: str,
        plugins: Sequence[DevicePlugin],
        gpus: Callable[[], Sequence[Device]],
        holdings: Callable[[], Iterable[Holding]],
        interval: float = DEFAULT_INTERVAL,
        alpha: float = 0.3,
        read_timeout: float = READ_TIMEOUT,
        clock: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.UTC),
    ) -> None:
        self.node_name = node_name
        self.plugins = plugins
        self.gpus = gpus
        self.holdings = holdings
        self.interval = interval
        self.read_timeout = read_timeout
        self._reading: asyncio.Future[dict[str, GpuTelemetry]] | None = None
        self.smoother = Smoother(alpha)
        self.rows: tuple[GpuRow, ...] = ()
        self.sampled_at: dt.datetime | None = None  # when ``rows`` were read (None: not yet)
        self._clock = clock
        self.last_error = ""
        self._names: dict[str, tuple[str, str]] = {}
        self._sandbox_names: SandboxNames | None = None

    def attach(self, sandbox_names: SandboxNames) -> None:
        self._sandbox_names = sandbox_names

    async def sample_once(self) -> None:
        """One round: read, smooth, map holders. A plugin failure keeps the last round (logged)."""
        loop = asyncio.get_running_loop()
        if self._reading is None:  # a read still stuck from an earlier round is waited on, not joined
            self._reading = loop.run_in_executor(None, telemetry_of, self.plugins)
        reading = self._reading
        try:
            done, _ = await asyncio.wait({reading}, timeout=self.read_timeout)
            if not done:
                stuck = f"the device plugins did not answer in {self.read_timeout:g}s (hung driver?)"
                raise TimeoutError(stuck)
            self._reading = None
            readings = reading.result()
            sampled_at = self._clock()
        except Exception as error:  # a plugin's failure: the last round stays, and says so
            message = str(error)[:300]
            if message != self.last_error:
                log_event(log, "gpu.telemetry_failed", logging.WARNING, node=self.node_name, error=message)
            self.last_error = message
            return
        if self.last_error:
            log_event(log, "gpu.telemetry_recovered", node=self.node_name)
        self.last_error = ""
        averages = self.smoother.update(readings)
        holdings = list(self.holdings())
        await self._learn_names({h.sandbox_id for h in holdings if h.sandbox_id})
        holders = holders_by_device(holdings, self._names)
        rows = []
        for device in self.gpus():
            if device.kind != DeviceKind.GPU or device.id not in readings:
                continue
            rows.append(GpuRow(device, readings[device.id], averages[device.id], holders.get(device.id, ())))
        self.rows = tuple(rows)
        self.sampled_at = sampled_at

    async def _learn_names(self, sandboxes: set[str]) -> None:
        unknown = sandboxes - set(self._names)
        if unknown and self._sandbox_names is not None:
            try:
                self._names.update(await self._sandbox_names(unknown))
            except Exception as error:  # the runtime's trouble: pods are named by UID this round
                log_event(log, "gpu.pod_names_unavailable", logging.WARNING, error=str(error)[:200])
        for gone in set(self._names) - sandboxes:
            del self._names[gone]

    async def run(self) -> None:
        while True:
            await self.sample_once()
            await asyncio.sleep(self.interval)


def _text(value: str) -> str:
    """A label value the exposition can encode: a lone surrogate (a topology file's JSON can spell
    one) would fail the whole scrape, so it becomes U+FFFD."""
    return value.encode("utf-8", "replace").decode("utf-8") if not value.isascii() else value


def _family(name: str, help_text: str) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, help_text, labels=LABELS)


class GpuMetricsCollector(Collector):
    """The sampler's last round as DCGM-named gauge families (see the module docstring)."""

    def __init__(self, sampler: GpuTelemetrySampler) -> None:
        self.sampler = sampler

    def describe(self) -> list[GaugeMetricFamily]:
        return []  # the families depend on what the GPUs report; collected on each scrape

    def collect(self) -> Iterator[GaugeMetricFamily]:
        families = {
            "util": _family("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %)."),
            "fb_used": _family("DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB)."),
            "fb_free": _family("DCGM_FI_DEV_FB_FREE", "Framebuffer memory free (in MiB)."),
            "temp": _family("DCGM_FI_DEV_GPU_TEMP", "GPU temperature (in C)."),
            "power": _family("DCGM_FI_DEV_POWER_USAGE", "Power draw (in W)."),
            "ecc": _family("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "Double-bit volatile ECC errors."),
            "xid": _family("DCGM_FI_DEV_XID_ERRORS", "Value of the last XID error encountered."),
            "avg": _family(
                "kubegpu_gpu_utilization_average", "Moving average of GPU utilization (in %)."
            ),
            "lost": _family("kubegpu_gpu_lost", "1 when the driver lost the GPU."),
        }
        node = self.sampler.node_name
        for row in self.sampler.rows:
            d, t = row.device, row.latest
            for namespace, pod, container in row.holders or (("", "", ""),):
                values = (str(d.index), d.id, f"nvidia{d.index}", d.model, node, namespace, pod, container)
                labels = [_text(v) for v in values]
                families["lost"].add_metric(labels, 1.0 if t.lost else 0.0)
                if t.lost:
                    continue
                families["util"].add_metric(labels, t.utilization)
                families["fb_used"].add_metric(labels, t.memory_used_mib)
                families["fb_free"].add_metric(labels, t.memory_free_mib)
                families["avg"].add_metric(labels, row.average.utilization)
                for key, value in (("temp", t.temperature_c), ("power", t.power_w),
                                   ("ecc", t.ecc_uncorrected), ("xid", t.xid)):
                    if value is not None:
                        families[key].add_metric(labels, float(value))
        yield from (family for family in families.values() if family.samples)
