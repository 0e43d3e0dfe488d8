"""An NRI plugin's session with containerd: connect, register, answer the runtime's calls.

The plugin connects to containerd's NRI socket, multiplexes it (crishim/nri/mux.py), serves the
``nri.pkg.api.v1alpha1.Plugin`` ttrpc service on logical connection 1 and calls the runtime's
``nri.pkg.api.v1alpha1.Runtime`` service on connection 2. The order on the wire, as containerd's
own plugin stub does it: the plugin calls ``RegisterPlugin(name, index)``; containerd then calls
``Configure`` (the plugin answers with the events it subscribes to) and ``Synchronize`` (every pod
and container it knows, in pieces while ``more`` is set), and from then on one call per
subscribed event (``CreateContainer``, ``StopContainer``, ``RemoveContainer``, ...). containerd
waits for each answer for its plugin request timeout (2 s by default) and drops a plugin that
does not answer in time.

``Handlers`` is what the plugin does: its methods take the request message and return the
response message (or raise ``RpcError``, which the runtime sees as that call's error). An event
is subscribed when its handler method exists (with none, only ``QUIET_EVENT``: NRI reads an empty
mask as every event). This module decides nothing about devices.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from google.protobuf.message import DecodeError, Message

from crishim.nri import api_pb2
from crishim.nri.mux import PLUGIN_SERVICE_CONN, RUNTIME_SERVICE_CONN, Mux
from crishim.nri.ttrpc import INVALID_ARGUMENT, UNIMPLEMENTED, Endpoint, RpcError
from kubegpu.logs import log_event

log = logging.getLogger("kubegpu.nri")

API_PACKAGE = "nri.pkg.api.v1alpha1"
PLUGIN_SERVICE = f"{API_PACKAGE}.Plugin"
RUNTIME_SERVICE = f"{API_PACKAGE}.Runtime"
DEFAULT_SOCKET = Path("/var/run/nri/nri.sock")
REGISTRATION_TIMEOUT = 5.0  # seconds; containerd's default plugin_registration_timeout

Event = api_pb2.Event
# The calls containerd makes with a method of their own (the answer can change the container):
# method -> (request type, handler method, the event that subscribes to it)
CALLS: dict[str, tuple[type[Message], str, int]] = {
    "CreateContainer": (api_pb2.CreateContainerRequest, "create_container", Event.CREATE_CONTAINER),
    "StopContainer": (api_pb2.StopContainerRequest, "stop_container", Event.STOP_CONTAINER),
    "ValidateContainerAdjustment": (
        api_pb2.ValidateContainerAdjustmentRequest,
        "validate_container_adjustment",
        Event.VALIDATE_CONTAINER_ADJUSTMENT,
    ),
}
# The events containerd only reports, through StateChange: event -> handler method (it gets the
# StateChangeEvent, with the pod and, for a container's event, the container)
STATE_EVENTS: dict[int, str] = {
    Event.RUN_POD_SANDBOX: "run_pod_sandbox",
    Event.STOP_POD_SANDBOX: "stop_pod_sandbox",
    Event.REMOVE_POD_SANDBOX: "remove_pod_sandbox",
    Event.POST_CREATE_CONTAINER: "post_create_container",
    Event.START_CONTAINER: "start_container",
    Event.POST_START_CONTAINER: "post_start_container",
    Event.REMOVE_CONTAINER: "remove_container",
}

# NRI reads an empty event mask as "every event" (containerd would then send CreateContainer and
# the rest to a plugin serving none of them, failing every create): a plugin with no event
# handler subscribes to this rare notification alone, answered with Empty.
QUIET_EVENT = Event.POST_UPDATE_POD_SANDBOX


# Every method the plugin serves: method -> (request type, handler method)
SERVED: dict[str, tuple[type[Message], str]] = {
    "Configure": (api_pb2.ConfigureRequest, "configure"),
    "Synchronize": (api_pb2.SynchronizeRequest, "synchronize"),
    "Shutdown": (api_pb2.Empty, "shutdown"),
    "StateChange": (api_pb2.StateChangeEvent, ""),
    **{method: (request, attr) for method, (request, attr, _) in CALLS.items()},
}


def event_mask(events: set[int]) -> int:
    """NRI's event mask: bit ``event - 1`` for each event."""
    mask = 0
    for event in events:
        if not 0 < event < Event.LAST:
            raise ValueError(f"not an NRI event: {event}")
        mask |= 1 << (event - 1)
    return mask


def subscribed_events(handlers: Any) -> set[int]:
    """The events ``handlers`` answers: one per handler method it has (CALLS, STATE_EVENTS)."""
    events = {event for _, method, event in CALLS.values() if hasattr(handlers, method)}
    return events | {event for event, method in STATE_EVENTS.items() if hasattr(handlers, method)}


@dataclass
class SyncCollector:
    """Collects Synchronize's pieces (``more`` set) until the last one, as containerd sends them."""

    pods: list[api_pb2.PodSandbox]
    containers: list[api_pb2.Container]

    @classmethod
    def empty(cls) -> SyncCollector:
        return cls([], [])

    def add(self, request: api_pb2.SynchronizeRequest) -> None:
        self.pods.extend(request.pods)
        self.containers.extend(request.containers)


class PluginSession:
    """One connection of the plugin to containerd, from registration to its end."""

    def __init__(
        self,
        handlers: Any,
        socket: Path = DEFAULT_SOCKET,
        name: str = "kubegpu",
        index: str = "10",
        on_event: Callable[[str], None] | None = None,
    ) -> None:
        if not (len(index) == 2 and index.isascii() and index.isdigit()):
            raise ValueError(f"NRI plugin index must be two digits, got {index!r}")
        self.handlers = handlers
        self.socket = socket
        self.name = name
        self.index = index
        self.on_event = on_event  # called with each method name after it is answered (tests, metrics)
        self.runtime_name = ""
        self.runtime_version = ""
        self.request_timeout = 2.0
        self.configured = asyncio.Event()
        self.synchronized = asyncio.Event()
        self._sync = SyncCollector.empty()
        self._mux: Mux | None = None
        self._server: Endpoint | None = None
        self._client: Endpoint | None = None
        self._shutdown = asyncio.Event()

    async def connect(self) -> None:
        """Connect and register; returns once containerd accepted the registration."""
        reader, writer = await asyncio.open_unix_connection(str(self.socket))
        self._mux = Mux(reader, writer)
        self._server = Endpoint(self._mux.channel(PLUGIN_SERVICE_CONN), self._serve, name="plugin")
        self._client = Endpoint(self._mux.channel(RUNTIME_SERVICE_CONN), None, name="runtime")
        self._mux.start()
        self._server.start()
        self._client.start()
        request = api_pb2.RegisterPluginRequest(plugin_name=self.name, plugin_idx=self.index)
        await self._client.call(
            RUNTIME_SERVICE, "RegisterPlugin", request.SerializeToString(), REGISTRATION_TIMEOUT
        )
        log_event(log, "nri.registered", plugin=f"{self.index}-{self.name}", socket=str(self.socket))

    @property
    def closed(self) -> bool:
        """Not connected: never connected, closed by containerd, or asked to shut down."""
        return self._mux is None or self._mux.closed.is_set() or self._shutdown.is_set()

    async def wait_closed(self) -> str:
        """Wait until containerd closes the connection or asks the plugin to shut down; why."""
        assert self._mux is not None
        closed = asyncio.ensure_future(self._mux.closed.wait())
        shutdown = asyncio.ensure_future(self._shutdown.wait())
        await asyncio.wait({closed, shutdown}, return_when=asyncio.FIRST_COMPLETED)
        for waiter in (closed, shutdown):
            waiter.cancel()
        return "shutdown requested" if self._shutdown.is_set() else f"connection closed: {self._mux.error}"

    async def close(self) -> None:
        for endpoint in (self._server, self._client):
            if endpoint is not None:
                await endpoint.close()
        if self._mux is not None:
            await self._mux.close()

    async def _serve(self, service: str, method: str, payload: bytes) -> bytes:
        request_type, attr = SERVED.get(method, (None, "")) if service == PLUGIN_SERVICE else (None, "")
        if request_type is None:
            raise RpcError(UNIMPLEMENTED, f"kubegpu NRI plugin does not serve {service}/{method}")
        request = request_type()
        try:
            request.ParseFromString(payload)
        except DecodeError as error:
            raise RpcError(INVALID_ARGUMENT, f"{method}: unreadable request: {error}") from None
        if method == "Configure":
            response: Message = self._configure(request)
        elif method == "Synchronize":
            response = await self._synchronize(request)
        elif method == "Shutdown":
            self._shutdown.set()
            response = api_pb2.Empty()
        elif method == "StateChange":
            handler = getattr(self.handlers, STATE_EVENTS.get(request.event, ""), None)
            if handler is not None:
                await _maybe_await(handler(request))
            response = api_pb2.Empty()
        else:
            handler = getattr(self.handlers, attr, None)
            if handler is None:
                raise RpcError(UNIMPLEMENTED, f"kubegpu NRI plugin did not subscribe to {method}")
            response = await _maybe_await(handler(request))
        if self.on_event is not None:
            self.on_event(method)
        return response.SerializeToString()

    def _configure(self, request: api_pb2.ConfigureRequest) -> api_pb2.ConfigureResponse:
        self.runtime_name, self.runtime_version = request.runtime_name, request.runtime_version
        if request.request_timeout > 0:
            self.request_timeout = request.request_timeout / 1000
        configure = getattr(self.handlers, "configure", None)
        if configure is not None:
            configure(request)
        events = subscribed_events(self.handlers) or {QUIET_EVENT}
        log_event(
            log,
            "nri.configured",
            plugin=f"{self.index}-{self.name}",
            runtime=f"{request.runtime_name} {request.runtime_version}",
            nri_version=request.NRI_version or None,
            request_timeout_ms=request.request_timeout,
            events=sorted(Event.Name(e) for e in events),
        )
        self.configured.set()
        return api_pb2.ConfigureResponse(events=event_mask(events))

    async def _synchronize(self, request: api_pb2.SynchronizeRequest) -> api_pb2.SynchronizeResponse:
        self._sync.add(request)
        if request.more:
            return api_pb2.SynchronizeResponse(more=True)
        pods, containers = self._sync.pods, self._sync.containers
        self._sync = SyncCollector.empty()
        synchronize = getattr(self.handlers, "synchronize", None)
        response = api_pb2.SynchronizeResponse()
        if synchronize is not None:
            response = await _maybe_await(synchronize(pods, containers)) or response
        log_event(log, "nri.synchronized", pods=len(pods), containers=len(containers))
        self.synchronized.set()
        return response


async def _maybe_await(value: Any) -> Any:
    return await value if asyncio.iscoroutine(value) else value
