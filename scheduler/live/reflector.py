"""List-then-watch of one resource as plain JSON, re-listing when the watch is too old (410 Gone).

The Kubernetes client's watch helper deserialises every event into model objects, which costs
more than the scheduling it feeds; this reads the watch stream's JSON lines directly (with orjson,
a few times faster than the standard library's json on a pod). A handler
receives ``replace(items, resource_version)`` after every (re)list and ``apply(type, object)`` for
each ADDED, MODIFIED or DELETED event. Watches resume from the last resourceVersion seen
(bookmarks included); API errors back off and re-list. ``abort`` breaks off the watch in flight
so that the thread running the reflector ends when its owner stops, not minutes later.

An ``optional`` resource (a CustomResourceDefinition that may not be installed, an API group
behind a feature gate) that the server does not serve (404 on the list) reads as an empty
collection, counts as synced, and is listed again every ``ABSENT_RETRY_SECONDS``, so it is
picked up once it is installed. One the server forbids this client to list (403, its RBAC
lacks the rule) before it was ever listed also counts as synced (nothing known of it), so the
caller does not wait for it; ``forbidden`` says so until a list succeeds. A 403 after a
successful list keeps what was listed and retries, as any other error (an RBAC change in
flight).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Protocol

import orjson
from kubernetes.client.rest import ApiException

from kubegpu.kube import shut_response
from kubegpu.logs import log_event

log = logging.getLogger("kubegpu.scheduler.reflector")

GONE = 410
NOT_FOUND = 404
FORBIDDEN = 403
ABSENT_RETRY_SECONDS = 30.0


class Handler(Protocol):
    def replace(self, items: list[dict[str, Any]], resource_version: str) -> None: ...

    def apply(self, event_type: str, obj: dict[str, Any]) -> None: ...


class WatchExpired(Exception):
    """The apiserver no longer has history at our resourceVersion: list again."""


def parse_events(lines: Iterator[bytes]) -> Iterator[tuple[str, dict[str, Any]]]:
    """(type, object) for each watch-stream line; ERROR 410 raises WatchExpired."""
    for line in lines:
        line = line.strip()
        if not line:
            continue
        event = orjson.loads(line)
        kind, obj = event.get("type"), event.get("object") or {}
        if kind == "ERROR":
            if obj.get("code") == GONE:
                raise WatchExpired(obj.get("message", "resource version too old"))
            raise ApiException(status=obj.get("code", 500), reason=obj.get("message", "watch error"))
        yield kind, obj


def response_lines(response: Any) -> Iterator[bytes]:
    """Split an HTTP response body stream into lines as they arrive."""
    pending = b""
    for chunk in response.stream(65536, decode_content=True):
        pending += chunk
        *complete, pending = pending.split(b"\n")
        yield from complete
    if pending:
        yield pending


class Reflector:
    """Keeps ``handler`` in sync with one collection of the API."""

    def __init__(
        self,
        name: str,
        list_call: Callable[..., Any],
        handler: Handler,
        list_kwargs: Mapping[str, Any] | None = None,
        watch_seconds: int = 300,
        *,
        optional: bool = False,
        absent_retry_seconds: float = ABSENT_RETRY_SECONDS,
    ) -> None:
        self.name = name
        self._list_call = list_call
        self._handler = handler
        self._kwargs = dict(list_kwargs or {})
        self._watch_seconds = watch_seconds
        self.synced = threading.Event()
        self.relists = 0
        self.optional = optional
        self.absent_retry_seconds = absent_retry_seconds
        self.absent = False  # an optional resource the server does not serve (as last listed)
        self.forbidden = False  # an optional resource this client may not list (never listed yet)
        self._lock = threading.Lock()
        self._response: Any = None  # the watch in flight
        self._aborted = False

    def list_once(self) -> str:
        response = self._list_call(_preload_content=False, **self._kwargs)
        try:
            body = orjson.loads(response.data)
        finally:
            response.release_conn()
        resource_version = body["metadata"]["resourceVersion"]
        self._handler.replace(body.get("items") or [], resource_version)
        self.relists += 1
        self.synced.set()
        return resource_version

    def watch_once(self, resource_version: str) -> str:
        """Watch until the server ends the stream; return the last resourceVersion seen."""
        response = self._list_call(
            watch=True,
            resource_version=resource_version,
            allow_watch_bookmarks=True,
            timeout_seconds=self._watch_seconds,
            _preload_content=False,
            **self._kwargs,
        )
        with self._lock:
            self._response = response
            aborted = self._aborted
        try:
            if aborted:
                return resource_version
            for kind, obj in parse_events(response_lines(response)):
                resource_version = (obj.get("metadata") or {}).get("resourceVersion", resource_version)
                if kind != "BOOKMARK":
                    self._handler.apply(kind, obj)
        finally:
            with self._lock:
                self._response = None
            if aborted or self._aborted:
                shut_response(response)  # broken off: the connection is not fit to be pooled again
            else:
                response.release_conn()
        return resource_version

    def abort(self) -> None:
        """Break off the watch in flight, from another thread (after setting the run's stop
        event): its blocked read ends at once instead of when the server ends the watch."""
        with self._lock:
            self._aborted = True
            response = self._response
        if response is not None:
            shut_response(response)

    def run(self, stop: threading.Event) -> None:
        """List, then watch forever (until ``stop``), re-listing on 410 and after errors."""
        failures = 0
        resource_version: str | None = None
        while not stop.is_set():
            try:
                if resource_version is None:
                    resource_version = self.list_once()
                    self.absent = self.forbidden = False
                resource_version = self.watch_once(resource_version)
                failures = 0
            except WatchExpired as expired:
                log_event(log, "watch.expired", resource=self.name, reason=str(expired))
                resource_version = None
            except Exception as error:  # network, API and decoding errors alike: back off, re-list
                if stop.is_set() or self._aborted:
                    return
                if resource_version is None and self._not_served(error):
                    stop.wait(self.absent_retry_seconds)
                    continue
                failures += 1
                wait = min(30.0, 0.5 * 2 ** min(failures, 6))
                log_event(
                    log,
                    "watch.failed",
                    logging.WARNING,
                    resource=self.name,
                    error=str(error)[:300],
                    retry_in_seconds=wait,
                )
                resource_version = None
                stop.wait(wait)

    def _not_served(self, error: Exception) -> bool:
        """An optional resource the list found not served: read it as empty, synced (True).
        Forbidden before it was ever listed: synced with nothing known, ``forbidden`` (True)."""
        if not (self.optional and isinstance(error, ApiException)):
            return False
        if error.status == FORBIDDEN and (self.forbidden or not self.synced.is_set()):
            if not self.forbidden:
                log_event(
                    log,
                    "watch.forbidden",
                    logging.WARNING,
                    resource=self.name,
                    reason=str(error.reason or "")[:200],
                    retry_in_seconds=self.absent_retry_seconds,
                )
            self.forbidden = True
            self.synced.set()
            return True
        if error.status != NOT_FOUND:
            return False
        if not self.absent:
            log_event(log, "watch.absent", resource=self.name, retry_in_seconds=self.absent_retry_seconds)
        self.absent = True
        self._handler.replace([], "")
        self.synced.set()
        return True
