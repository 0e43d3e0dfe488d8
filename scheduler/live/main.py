"""``kubegpu scheduler``: run one replica (watchers, optional leader election, metrics, scheduling)."""

from __future__ import annotations

import gc
import logging
import os
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
from scheduler.live.relay import Relay, advertised_url, leader_annotation
from scheduler.live.scheduler import Scheduler

log = logging.getLogger("kubegpu.scheduler")
SYNC_TIMEOUT_SECONDS = 120.0
# connections kept to the apiserver beyond one per bind worker: the watches, Events, reads back
API_POOL_SPARE = 8
# and for the extender's binds: kube-scheduler binds each pod in a goroutine of its own, so their
# number in flight is its rate times the Binding's latency (over 24 in bench/extender_throughput.py)
EXTENDER_BIND_CONNECTIONS = 48


def scheduler_api(config: SchedulerConfig, kubeconfig: str | None, extender: bool) -> Any:
    """The replica's API client (None: no kubeconfig and not in a cluster), keeping a connection
    for each Binding in flight (``bindWorkers``, and with ``extender`` kube-scheduler's binds
    through it) and the rest: with the client's default pool (5 per CPU: 10 on a 2-CPU node) the
    Bindings beyond it opened a new TLS connection each, and dropped it."""
    pool = config.bind_workers + API_POOL_SPARE + (EXTENDER_BIND_CONNECTIONS if extender else 0)
    return api_client(kubeconfig, pool=pool)


def freeze_startup_heap(what: str) -> None:
    """Collect, then move every object alive now (the modules, the Kubernetes client's classes, the
    first lists' nodes and pods) out of the cyclic garbage collector's generations (``gc.freeze``):
    its full collections then scan only what came after. After the imports alone that heap is
    about 120,000 objects, 40 ms a full collection, each stalling every thread (verbs included);
    in bench/extender_throughput.py a full collection took 120 ms once a round. Frozen objects are
    still freed when their last reference goes; only a reference cycle among them would stay."""
    collected = gc.collect()
    gc.freeze()
    log_event(log, f"{what}.heap_frozen", objects=gc.get_freeze_count(), collected=collected)


def _stop_on_signals(stop: threading.Event, event: str) -> None:
    """SIGTERM and SIGINT set ``stop``, logged as ``event``."""

    def on_signal(signum: int, frame: FrameType | None) -> None:
        log_event(log, event, signal=signum)
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)


def _watch_and_lead(
    scheduler: Scheduler, api: Any, what: str, extender_url: str | None = None
) -> threading.Thread | None:
    """Start the watches, wait (bounded) for their first lists, then lead or run the election
    (a leader with an extender writes its URL on the Lease, for standbys to relay to)."""
    scheduler.start_watching()
    if not scheduler.wait_synced(SYNC_TIMEOUT_SECONDS):
        log_event(log, f"{what}.sync_timeout", logging.ERROR, seconds=SYNC_TIMEOUT_SECONDS)
    freeze_startup_heap(what)
    annotations = leader_annotation(scheduler.config.identity, extender_url) if extender_url else None
    return scheduler.start_leading(api, annotations)


def run_scheduler(config: SchedulerConfig, kubeconfig: str | None) -> int:
    api = scheduler_api(config, kubeconfig, extender=config.extender_address is not None)
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
    extender, extender_url = _extender_server(scheduler, config)
    elector_thread = _watch_and_lead(scheduler, api, "scheduler", extender_url)
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


def _extender_server(scheduler: Scheduler, config: SchedulerConfig) -> tuple[Any, str | None]:
    """With ``extenderAddress``: the extender's HTTP(S) server on this replica's cache, started,
    and the URL other replicas reach it at (None: not known)."""
    if config.extender_address is None:
        return None, None
    tls = None
    if config.extender_tls_cert_file and config.extender_tls_private_key_file:
        tls = (config.extender_tls_cert_file, config.extender_tls_private_key_file)
    return _serve_extender(scheduler, config.extender_address, tls, config.extender_advertise_address)


def _serve_extender(
    scheduler: Scheduler, address: str, tls: tuple[str, str] | None, advertise: str | None
) -> tuple[Any, str | None]:
    """Start the extender's server on ``address``; with leader election a standby relays the verbs
    to the leader (scheduler/live/relay.py)."""
    from scheduler.live.extender import Extender, ExtenderServer

    extender = Extender(scheduler)
    relay = None
    url = None
    if scheduler.config.leader_election.enabled:
        relay = Relay(
            lambda: scheduler.elector,
            scheduler.config.identity,
            scheduler.metrics.registry,
            tls[0] if tls else None,
        )
        url = advertised_url(advertise, address, tls is not None, os.environ)
    server = ExtenderServer(extender, address, lambda: _ready(scheduler), tls, relay)
    server.start()
    if url is None and relay is not None:
        reason = "no extenderAdvertiseAddress, no POD_IP and a wildcard listening address"
        log_event(log, "extender.not_advertised", logging.WARNING, reason=reason)
    log_event(log, "extender.serving", address=address, tls=tls is not None, url=url)
    return server, url


def run_extender(
    config: SchedulerConfig, kubeconfig: str | None, address: str, tls: tuple[str, str] | None
) -> int:
    """``kubegpu extender``: serve kube-scheduler's extender protocol from a Scheduler's cache
    (scheduler/live/extender.py) until SIGTERM; with leader election only the leader answers,
    standbys relay to it."""
    api = scheduler_api(config, kubeconfig, extender=True)
    if api is None:
        log_event(log, "extender.no_api", logging.ERROR, reason="needs --kubeconfig or an in-cluster account")
        return 2
    scheduler = Scheduler(config, api, KeyRing(Path(config.keys_dir), allow_private=True))
    stop = scheduler.stop_event
    _stop_on_signals(stop, "extender.stopping")

    server, url = _serve_extender(scheduler, address, tls, config.extender_advertise_address)
    elector_thread = _watch_and_lead(scheduler, api, "extender", url)
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
