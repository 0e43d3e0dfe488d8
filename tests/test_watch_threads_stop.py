"""Watch threads end when their owner stops: the node agent's pod cache and the scheduler's reflectors.

On a quiet cluster a watch sends nothing for minutes, and its thread is blocked in a read. If
stop() only sets a flag, that thread outlives its owner: at the end of a test run the API server
it reads from goes away and it logs ("Response ended prematurely", urllib3's "Connection pool is
full") into streams pytest has already closed ("--- Logging error ---"). Here the API is a loopback
server that answers the list and then holds the watch open without a word.
"""

from __future__ import annotations

import logging
import threading

import pytest
from kubernetes import client as k8s

from crishim.podlookup import NodePodCache
from kubegpu.allocation import KeyRing
from scheduler.live.config import SchedulerConfig
from scheduler.live.reflector import Reflector
from scheduler.live.scheduler import Scheduler
from tests.fixtures.keys import SIGNING
from tests.support.quietwatch import quiet_watch_api


def test_stopping_the_pod_cache_breaks_off_its_silent_watch_quietly(caplog: pytest.LogCaptureFixture) -> None:
    """The watch broken off by stop() is no failure to report (pod_cache.failed was logged)."""
    with quiet_watch_api() as (api, watching):
        cache = NodePodCache(k8s.CoreV1Api(api), "node-a").start()
        assert cache.synced.wait(10) and watching.wait(10)
        cache.stop(timeout=10)
        assert not cache.running
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []


class _Nothing:
    def replace(self, items: object, resource_version: str) -> None:
        pass

    def apply(self, event_type: str, obj: object) -> None:
        pass


def test_aborting_a_reflector_breaks_off_its_silent_watch() -> None:
    with quiet_watch_api() as (api, watching):
        stop = threading.Event()
        reflector = Reflector("pods", k8s.CoreV1Api(api).list_pod_for_all_namespaces, _Nothing())
        thread = threading.Thread(target=reflector.run, args=(stop,), daemon=True)
        thread.start()
        assert reflector.synced.wait(10) and watching.wait(10)
        stop.set()
        reflector.abort()
        thread.join(timeout=10)
        assert not thread.is_alive()
        # Nothing was delivered: the watch was held open until abort(), not ended by the server.
        assert reflector.relists == 1


def test_stopping_the_scheduler_ends_its_watch_threads() -> None:
    with quiet_watch_api() as (api, watching):
        scheduler = Scheduler(SchedulerConfig(scheduler_name="quiet"), api, KeyRing(None, SIGNING), seed=1)
        scheduler.start_watching()
        assert scheduler.wait_synced(10) and watching.wait(10)
        threads = scheduler.watch_threads()
        assert len(threads) == len(scheduler.reflectors()) + 1  # every reflector and the staleness check
        scheduler.stop()
        assert [t.name for t in threads if t.is_alive()] == []
