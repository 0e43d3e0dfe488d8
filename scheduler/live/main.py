"""``kubegpu scheduler``: run one replica (watchers, optional leader election, metrics, scheduling)."""

from __future__ import annotations

import logging
import signal
import threading
from pathlib import Path
from types import FrameType
from typing import Any

from kubegpu.allocation import KeyRing
from kubegpu.httpserve import MetricsServer
from kubegpu.kube import api_client
from kubegpu.logs import log_event
from scheduler.live.config import SchedulerConfig
from scheduler.live.scheduler import Scheduler

log = logging.getLogger("kubegpu.scheduler")
SYNC_TIMEOUT_SECONDS = 120.0


def _stop_on_signals(stop: threading.Event, event: str) -> None:
    """SIGTERM and SIGINT set ``stop``, logged as ``event``."""

    def on_signal(signum: int, frame: FrameType | None) -> None:
        log_event(log, event, signal=signum)
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)


def _watch_and_lead(scheduler: Scheduler, api: Any, what: str) -> threading.Thread | None:
    """Start the watches, wait (bounded) for their first lists, then lead or run the election."""
    scheduler.start_watching()
    if not scheduler.wait_synced(SYNC_TIMEOUT_SECONDS):
        log_event(log, f"{what}.sync_timeout", logging.ERROR, seconds=SYNC_TIMEOUT_SECONDS)
    return scheduler.start_leading(api)


def run_scheduler(config: SchedulerConfig, kubeconfig: str | None) -> int:
    api = api_client(kubeconfig)
    if api is None:
        log_event(
            log, "scheduler.no_api", logging.ERROR, reason="needs --kubeconfig or an in-cluster account"
        )
        return 2
    scheduler = Scheduler(config, api, KeyRing(Path(config.keys_dir), allow_private=True))
    stop = scheduler.stop_event
    _stop_on_signals(stop, "scheduler.stopping")
    server = None
    if config.metrics_address:
        server = MetricsServer(
            config.metrics_address,
            scheduler.metrics.render,
            {
                "/healthz": lambda: (not stop.is_set(), "ok"),
                "/readyz": lambda: (
                    scheduler.node_reflector.synced.is_set() and scheduler.pod_reflector.synced.is_set(),
                    "synced",
                ),
            },
        )
        server.start()
    extender = _extender_server(scheduler, config)
    elector_thread = _watch_and_lead(scheduler, api, "scheduler")
    log_event(
        log,
        "scheduler.started",
        name=config.scheduler_name,
        identity=config.identity,
        policy=config.policy,
        leader_election=config.leader_election.enabled,
    )
    scheduler.run()
    scheduler.stop()
    if elector_thread is not None:
        elector_thread.join(timeout=10)
    if server is not None:
        server.stop()
    if extender is not None:
        extender.stop()
    return 0


def _ready(scheduler: Scheduler) -> tuple[bool, str]:
    """Whether this replica may answer the extender's verbs: synced, leading, past the fence."""
    if not (scheduler.node_reflector.synced.is_set() and scheduler.pod_reflector.synced.is_set()):
        return False, "caches not synced"
    if not scheduler.leading.is_set():
        return False, "not the leader"
    if scheduler.fenced:
        return False, "new leader: waiting out the former leader's Bindings"
    return True, "ready"


def _extender_server(scheduler: Scheduler, config: SchedulerConfig) -> Any:
    """With ``extenderAddress``: the extender's HTTP(S) server on this replica's cache, started."""
    if config.extender_address is None:
        return None
    from scheduler.live.extender import Extender, ExtenderServer

    tls = None
    if config.extender_tls_cert_file and config.extender_tls_private_key_file:
        tls = (config.extender_tls_cert_file, config.extender_tls_private_key_file)
    server = ExtenderServer(Extender(scheduler), config.extender_address, lambda: _ready(scheduler), tls)
    server.start()
    log_event(log, "extender.serving", address=config.extender_address, tls=tls is not None)
    return server


def run_extender(
    config: SchedulerConfig, kubeconfig: str | None, address: str, tls: tuple[str, str] | None
) -> int:
    """``kubegpu extender``: serve kube-scheduler's extender protocol from a Scheduler's cache
    (scheduler/live/extender.py) until SIGTERM; with leader election only the leader is ready."""
    from scheduler.live.extender import Extender, ExtenderServer

    api = api_client(kubeconfig)
    if api is None:
        log_event(log, "extender.no_api", logging.ERROR, reason="needs --kubeconfig or an in-cluster account")
        return 2
    scheduler = Scheduler(config, api, KeyRing(Path(config.keys_dir), allow_private=True))
    stop = scheduler.stop_event
    _stop_on_signals(stop, "extender.stopping")

    server = ExtenderServer(Extender(scheduler), address, lambda: _ready(scheduler), tls)
    server.start()
    elector_thread = _watch_and_lead(scheduler, api, "extender")
    log_event(
        log,
        "extender.started",
        address=address,
        tls=tls is not None,
        scheduler_name=config.scheduler_name,
        identity=config.identity,
        policy=config.policy,
        leader_election=config.leader_election.enabled,
    )
    while not stop.is_set():
        scheduler.tend(0.5)
    scheduler.stop()
    if elector_thread is not None:
        elector_thread.join(timeout=10)
    server.stop()
    return 0
