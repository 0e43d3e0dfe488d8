"""``kubegpu scheduler``: run one replica (watchers, optional leader election, metrics, scheduling)."""

from __future__ import annotations

import logging
import signal
import threading
from pathlib import Path
from types import FrameType

from crishim.rewrite import KeyRing
from kubegpu.httpserve import MetricsServer
from kubegpu.kube import api_client
from kubegpu.logs import log_event
from scheduler.live.config import SchedulerConfig
from scheduler.live.scheduler import Scheduler

log = logging.getLogger("kubegpu.scheduler")
SYNC_TIMEOUT_SECONDS = 120.0


def run_scheduler(config: SchedulerConfig, kubeconfig: str | None) -> int:
    api = api_client(kubeconfig)
    if api is None:
        log_event(
            log, "scheduler.no_api", logging.ERROR, reason="needs --kubeconfig or an in-cluster account"
        )
        return 2
    scheduler = Scheduler(config, api, KeyRing(Path(config.keys_dir)))
    stop = scheduler.stop_event

    def on_signal(signum: int, frame: FrameType | None) -> None:
        log_event(log, "scheduler.stopping", signal=signum)
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
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
    scheduler.start_watching()
    if not scheduler.wait_synced(SYNC_TIMEOUT_SECONDS):
        log_event(log, "scheduler.sync_timeout", logging.ERROR, seconds=SYNC_TIMEOUT_SECONDS)
    elector_thread = _start_leading(scheduler, api)
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
    return 0


def _start_leading(scheduler: Scheduler, api: object) -> threading.Thread | None:
    """Lead at once, or run the Lease election; losing the lease stops this replica."""
    config = scheduler.config
    if not config.leader_election.enabled:
        scheduler.leading.set()
        scheduler.metrics.leader.set(1)
        return None
    from kubernetes import client as k8s

    from scheduler.live.leader import LeaderElector

    election = config.leader_election
    elector = LeaderElector(
        k8s.CoordinationV1Api(api),
        election.namespace,
        election.lease_name,
        config.identity,
        lease_seconds=election.lease_seconds,
        renew_deadline=election.renew_deadline_seconds,
        retry_period=election.retry_period_seconds,
    )

    def started() -> None:
        log_event(log, "leader.acquired", identity=config.identity, lease=election.lease_name)
        scheduler.metrics.leader.set(1)
        scheduler.leading.set()

    def stopped() -> None:
        log_event(log, "leader.lost", logging.WARNING, identity=config.identity, lease=election.lease_name)
        scheduler.metrics.leader.set(0)
        scheduler.leading.clear()
        scheduler.stop_event.set()  # like kube-scheduler: a replica that lost the lease exits

    thread = threading.Thread(
        target=elector.run, args=(started, stopped, scheduler.stop_event), name="leader-election", daemon=True
    )
    thread.start()
    return thread
