"""The loop the node agent's periodic publishers share (``NodeGpuMetric``: crishim/metricspublisher.py;
``NodeResourceTopology``: crishim/nrtpublisher.py): sync every interval on a daemon thread until
stopped, log a failure once per distinct message and the recovery after it, and read the Node's
uid for the published object's owner reference."""

from __future__ import annotations

import json
import logging
import threading
from typing import Any

from kubernetes.client.rest import ApiException

from kubegpu.logs import log_event


def api_message(error: ApiException) -> str:
    """The apiserver's own message of an error (its Status ``message``), else the reason."""
    try:
        message = json.loads(error.body or "{}").get("message")
    except (ValueError, AttributeError):
        message = None
    return str(message or error.reason or error.status)[:300]


def describe(error: Exception) -> str:
    """One line for a failed round: an API error as its status and the apiserver's message (not
    ``str(ApiException)``, whose response headers differ on every request and push the message
    out of the line); anything else as it is."""
    if isinstance(error, ApiException):
        return f"({error.status}) {api_message(error)}"
    return str(error)[:400]


class PeriodicPublisher:
    """Base of a publisher: subclasses set ``event`` (the log events' stem, e.g. ``metrics`` for
    ``node.metrics_publish_failed``), ``thread_name``, ``node_name`` and ``_core`` (a CoreV1Api),
    call ``_init_loop()``, and give ``sync_once()`` and ``interval_seconds()``."""

    event = ""
    thread_name = "publisher"
    logger = logging.getLogger("kubegpu.crishim")
    node_name: str
    _core: Any

    def _init_loop(self) -> None:
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def sync_once(self) -> str:
        raise NotImplementedError

    def interval_seconds(self) -> float:
        raise NotImplementedError

    def _node_uid(self) -> str | None:
        try:
            return str(self._core.read_node(self.node_name).metadata.uid)
        except Exception as error:  # not owned then: the object outlives a deleted Node (logged)
            log_event(
                self.logger,
                f"node.{self.event}_unowned",
                logging.WARNING,
                node=self.node_name,
                error=str(error)[:200],
            )
            return None

    def run(self) -> None:
        """Loop until stop(): sync every interval; an error is logged once and tried again."""
        failing = ""
        while not self._stop.is_set():
            try:
                self.sync_once()
                if failing:
                    log_event(self.logger, f"node.{self.event}_publish_recovered", node=self.node_name)
                failing = ""
            except Exception as error:  # API, network, plugin or discovery errors alike
                message = describe(error)
                if message != failing:
                    log_event(
                        self.logger,
                        f"node.{self.event}_publish_failed",
                        logging.WARNING,
                        node=self.node_name,
                        error=message,
                    )
                failing = message
            self._stop.wait(self.interval_seconds())

    def start(self) -> None:
        self._thread = threading.Thread(target=self.run, name=self.thread_name, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
