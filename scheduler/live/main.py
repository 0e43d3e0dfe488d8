"""``kubegpu scheduler``: run one replica (watchers, optional leader election, metrics, scheduling)."""

from __future__ import annotations

import logging
import signal
from pathlib import Path
from types import FrameType

from kubegpu.allocation import KeyRing
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
    scheduler = Scheduler(config, api, KeyRing(Path(config.keys_dir), allow_private=True))
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
    elector_thread = scheduler.start_leading(api)
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
