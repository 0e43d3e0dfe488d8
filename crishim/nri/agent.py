"""The node agent as an NRI plugin: containerd's container events, decided by the rewrite core.

``NriAgent`` is the ``Handlers`` of an NRI ``PluginSession`` (crishim/nri/plugin.py). It brings
each event to the same ``AllocationRewriter`` the CRI proxy uses, in the core's terms:

- ``Synchronize`` (every (re)connection): the ledger is rebuilt from the containers containerd
  reports, by the marks the agent wrote on them (``install_rebuilt``), before any create is
  decided; what is not reported any more is no longer held.
- ``CreateContainer``: the container (``front.spec_from_nri``) and its pod's sandbox annotations
  go through ``AllocationRewriter.decide``, the very decision of the CRI proxy; its result is
  answered as a ``ContainerAdjustment`` (``front.adjustment``). A refusal is the call's error,
  with the proxy's reason text, and containerd fails the create with it. The container's id is
  known here, so its devices are booked to it at once.
- ``StopContainer``, ``RemoveContainer`` and ``RemovePodSandbox`` release what the container or
  pod held (a stopped container never runs again: kubelet creates a new one).

NRI does not show a container's security context: ``security`` (``pod_security``: the Pod from
the node's pod cache or the API) supplies what the CRI front reads from the request; a static
pod (no API object) and an agent given none count as neither privileged nor given CAP_SYS_ADMIN
(docs/nri.md).
"""

from __future__ import annotations

import logging
import os
import stat
from collections.abc import Awaitable, Callable

import grpc

from crishim.capabilities import sys_admin_grant
from crishim.cri import api_pb2 as cri_pb2
from crishim.hostpaths import BLOCK, CHAR, Ambiguous, DeviceNumber
from crishim.intercept import Rejected
from crishim.ledger import MARK_ANNOTATION
from crishim.nri import api_pb2
from crishim.nri.front import adjustment, foreign_grant, spec_from_nri
from crishim.nri.ttrpc import FAILED_PRECONDITION, INTERNAL, INVALID_ARGUMENT, UNAVAILABLE, RpcError
from crishim.podlookup import ApiPodLookup
from crishim.rewrite import AllocationRewriter, ContainerCreate, PodRef, Security, is_static_pod
from kubegpu.logs import log_event

log = logging.getLogger("kubegpu.nri")

# kubelet's annotation with a container's restart count: CRI's attempt, which NRI does not carry
RESTART_COUNT_ANNOTATION = "io.kubernetes.container.restartCount"
GRPC_TO_TTRPC = {
    grpc.StatusCode.INVALID_ARGUMENT: INVALID_ARGUMENT,
    grpc.StatusCode.FAILED_PRECONDITION: FAILED_PRECONDITION,
    grpc.StatusCode.UNAVAILABLE: UNAVAILABLE,
}
SecurityLookup = Callable[[PodRef, str], Awaitable[Security]]
MAX_PENDING_VALIDATIONS = 4096  # creates answered whose validation never came (the create failed)
# Of containerd's request timeout, what a create may wait for a GPU's MPS daemon to start: the
# rest answers the refusal (with the reason) before containerd gives up on the plugin.
DAEMON_WAIT_SHARE = 0.5


def host_device_number(path: str) -> DeviceNumber:
    """The type and numbers of a host device node (what an OCI device entry is made from)."""
    info = os.stat(path)
    if stat.S_ISCHR(info.st_mode):
        kind = CHAR
    elif stat.S_ISBLK(info.st_mode):
        kind = BLOCK
    else:
        raise OSError(f"{path} is not a device node")
    return DeviceNumber(kind, os.major(info.st_rdev), os.minor(info.st_rdev))


def attempt_of(annotations: dict[str, str] | object) -> int:
    raw = annotations.get(RESTART_COUNT_ANNOTATION, "0") if isinstance(annotations, dict) else "0"
    return int(raw) if raw.isascii() and raw.isdigit() and len(raw) < 10 else 0


class NriAgent:
    """NRI handlers that drive the rewrite core (see the module docstring)."""

    def __init__(
        self,
        rewriter: AllocationRewriter,
        security: SecurityLookup | None = None,
        number_of: Callable[[str], DeviceNumber] = host_device_number,
    ) -> None:
        self.rewriter = rewriter
        self._security = security
        self._number_of = number_of
        # container id -> the adjustment this agent answered, until containerd validates
        self._granted: dict[str, api_pb2.ContainerAdjustment] = {}
        self._daemon_wait = 2.0 * DAEMON_WAIT_SHARE  # of containerd's default 2 s, until Configure

    def configure(self, request: api_pb2.ConfigureRequest) -> None:
        if request.request_timeout > 0:
            self._daemon_wait = request.request_timeout / 1000 * DAEMON_WAIT_SHARE
        log_event(log, "nri.configured", runtime=request.runtime_name, version=request.runtime_version)

    def synchronize(self, pods: list[api_pb2.PodSandbox], containers: list[api_pb2.Container]) -> None:
        pod_uids = {pod.id: pod.uid for pod in pods}
        live = [c for c in containers if c.state != api_pb2.CONTAINER_STOPPED]
        live.sort(key=lambda c: (c.state != api_pb2.CONTAINER_RUNNING, c.id))
        found = [
            (
                c.id,
                self.rewriter.holdings_by_mark(
                    c.id,
                    c.pod_sandbox_id,
                    c.name,
                    attempt_of(dict(c.annotations)),
                    c.annotations.get(MARK_ANNOTATION, ""),
                    pod_uids.get(c.pod_sandbox_id),
                ),
            )
            for c in live
        ]
        self.rewriter.install_rebuilt(found)

    async def create_container(
        self, request: api_pb2.CreateContainerRequest
    ) -> api_pb2.CreateContainerResponse:
        pod = PodRef(request.pod.namespace, request.pod.name, request.pod.uid)
        container = request.container
        try:
            spec = spec_from_nri(container)
            static = is_static_pod(dict(request.pod.annotations))
            lookup = self._security if not static else None
            security = await lookup(pod, container.name) if lookup is not None else Security()
            create = ContainerCreate(
                pod=pod,
                sandbox_id=request.pod.id,
                sandbox_annotations=dict(request.pod.annotations),
                container=container.name,
                attempt=attempt_of(dict(container.annotations)),
                image="",
                security=security,
                spec=spec.copy(),
                daemon_wait=self._daemon_wait,
            )
            completion = await self.rewriter.decide(create)
        except Rejected as refused:
            log_event(
                log,
                "nri.create_refused",
                logging.WARNING,
                pod=str(pod),
                container=container.name,
                reason=refused.message,
            )
            raise RpcError(GRPC_TO_TTRPC.get(refused.code, FAILED_PRECONDITION), refused.message) from None
        except Ambiguous as error:  # an entry the front could not read
            message = f"pod {pod} container {container.name}: refused: {error}"
            raise RpcError(INVALID_ARGUMENT, message) from None
        try:
            adjust = adjustment(spec, create.spec, self._number_of)
        except (OSError, Ambiguous) as error:  # a granted node unreadable; a change NRI cannot make
            if completion is not None:
                completion(None)
            if isinstance(error, Ambiguous):
                message = f"pod {pod} container {container.name}: refused: {error}"
                log_event(log, "nri.create_refused", logging.WARNING, pod=str(pod), reason=message)
                raise RpcError(INVALID_ARGUMENT, message) from None
            raise RpcError(INTERNAL, f"pod {pod}: a granted device node cannot be read: {error}") from None
        if completion is not None:
            completion(container.id)
        self._granted[container.id] = adjust
        if len(self._granted) > MAX_PENDING_VALIDATIONS:
            self._granted.pop(next(iter(self._granted)))
        return api_pb2.CreateContainerResponse(adjust=adjust)

    def validate_container_adjustment(
        self, request: api_pb2.ValidateContainerAdjustmentRequest
    ) -> api_pb2.ValidateContainerAdjustmentResponse:
        """Approve the adjustments every plugin made, unless they reach a managed device the agent
        did not grant this container or undo what it set (``front.foreign_grant``: another plugin,
        before or after kubegpu, adding a device, a device cgroup rule, a toolkit selector or
        mount, a managed CDI name or annotation; or removing the agent's variables or mark).

        Subscribing at all is what makes the agent's death fail the create: containerd creates a
        container without the adjustment of a plugin whose CreateContainer call failed fatally
        (connection lost, or no answer in time), but it fails the create when a validator cannot
        answer (docs/nri.md)."""
        container = request.container.id
        ours = self._granted.pop(container, None) or api_pb2.ContainerAdjustment()
        why = foreign_grant(request.adjust, ours, self.rewriter.node_devices.managed)
        if why is not None:
            pod = f"{request.pod.namespace}/{request.pod.name}"
            reason = f"pod {pod} container {request.container.name}: {why}"
            log_event(log, "nri.adjustment_rejected", logging.WARNING, reason=reason)
            return api_pb2.ValidateContainerAdjustmentResponse(reject=True, reason=reason)
        return api_pb2.ValidateContainerAdjustmentResponse()

    def stop_container(self, request: api_pb2.StopContainerRequest) -> api_pb2.StopContainerResponse:
        """A stopped container never runs again (kubelet creates a new one): its devices are free."""
        self.rewriter.removed_container(request.container.id)
        return api_pb2.StopContainerResponse()

    def remove_container(self, event: api_pb2.StateChangeEvent) -> None:
        self.rewriter.removed_container(event.container.id)

    def remove_pod_sandbox(self, event: api_pb2.StateChangeEvent) -> None:
        self.rewriter.removed_sandbox(event.pod.id)


def pod_security(lookup: ApiPodLookup) -> SecurityLookup:
    """Read a container's security facts from its Pod (the node's pod cache, else a read): NRI
    shows no security context. A container the cached Pod does not have yet (an ephemeral one
    added since) is read afresh. A pod that cannot be read, or that does not have the container,
    is refused for now (UNAVAILABLE): kubelet retries the create."""

    async def security(pod: PodRef, container: str) -> Security:
        facts = await lookup.facts(pod.namespace, pod.name, pod.uid)
        if facts is not None and container not in facts.security:  # the cache is behind (kubectl debug)
            facts = await lookup.facts(pod.namespace, pod.name, pod.uid, fresh=True)
        if facts is None or container not in facts.security:
            raise Rejected(
                grpc.StatusCode.UNAVAILABLE,
                f"pod {pod} container {container}: its security context cannot be read from the API "
                "(NRI does not show it), retry",
            )
        privileged, added = facts.security[container]
        return Security(privileged, sys_admin_grant(cri_pb2.Capability(add_capabilities=list(added))))

    return security
