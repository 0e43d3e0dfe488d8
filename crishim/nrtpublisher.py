"""The node agent's NodeResourceTopology: its GPUs and NUMA zones for the tools that read NRT.

Every ``interval`` seconds (default 30) the publisher builds the node's object (``kubegpu.nrt``:
zones from the inventory, the node ledger's holdings and the kernel's NUMA nodes) and writes it
only when it differs from what it last wrote, or when the last write is ``refresh`` seconds old
(default 300, so an object deleted behind its back comes back). One write is one merge patch; the
object is created (owned by the Node, labelled ``app.kubernetes.io/managed-by: kubegpu``) the
first time or when it is gone. Each patch carries the resourceVersion of the publisher's own last
write, so a write by anyone else since fails it (409). Before its first write (and after a 409)
the publisher reads the object once: one that another writer keeps (NFD's topology updater, say:
no kubegpu label) is left alone, logged once (``node.nrt_not_ours``) and looked at again every
``refresh`` seconds. So the API cost is at most one write per interval per
node, and one per ``refresh`` while nothing changes.

The CRD is never installed or changed here. Without it (or with a copy that does not serve
``v1alpha2``, or whose schema refuses the object) every round fails with one clear
``node.nrt_publish_failed`` line (once per distinct error) and is tried again next interval;
nothing else in the agent notices. It runs in its own thread, like the advertiser.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from kubernetes.client.rest import ApiException

from crishim.publishloop import PeriodicPublisher, api_message
from devices.model import NodeInventory
from kubegpu import nrt
from kubegpu.logs import log_event

log = logging.getLogger("kubegpu.crishim.nrtpublisher")

MERGE_PATCH = "application/merge-patch+json"
NOT_FOUND = 404
CONFLICT = 409


class NrtUnavailable(RuntimeError):
    """The API does not take the object: the CRD is absent, does not serve v1alpha2, or refuses it."""


def content(body: Mapping[str, Any]) -> dict[str, Any]:
    """What a write says besides metadata (absent attributes as None, so a merge patch removes them)."""
    return {key: body.get(key) for key in ("zones", "attributes", "topologyPolicies")}


def _version(obj: Any) -> str | None:
    """The resourceVersion of an object as the API returned it (None when it says none)."""
    meta = obj.get("metadata") if isinstance(obj, Mapping) else None
    version = meta.get("resourceVersion") if isinstance(meta, Mapping) else None
    return str(version) if version else None


class TopologyPublisher(PeriodicPublisher):
    """Keeps one node's NodeResourceTopology current (module docstring).

    ``inventory`` gives the node's devices with today's health, ``held`` the ids of the devices
    containers hold, ``numa_nodes`` the kernel's NUMA nodes. ``policy``/``scope``: the kubelet's
    Topology Manager settings, published only when ``policy`` is given. ``clock``: monotonic seconds.
    """

    event = "nrt"
    thread_name = "nrt-publisher"
    logger = log

    def __init__(
        self,
        custom_api: Any,
        core_api: Any,
        node_name: str,
        inventory: Callable[[], NodeInventory],
        held: Callable[[], Iterable[str]],
        numa_nodes: Callable[[], Mapping[int, nrt.NumaNode]],
        interval: float = 30.0,
        refresh: float = 300.0,
        host_resources: bool = False,
        policy: str = "",
        scope: str = "container",
        clock: Callable[[], float] | None = None,
    ) -> None:
        if policy:
            nrt.topology_policy(policy, scope)  # ValueError now rather than every round
        self._custom = custom_api
        self._core = core_api
        self.node_name = node_name
        self._inventory = inventory
        self._held = held
        self._numa_nodes = numa_nodes
        self.interval = interval
        self.refresh = refresh
        self.host_resources = host_resources
        self.policy = policy
        self.scope = scope
        self._clock = clock or time.monotonic
        self.written: dict[str, Any] | None = None  # content() of the last write
        self._version: str | None = None  # the object's resourceVersion as last written or read by us
        self._written_at = 0.0
        self._foreign_since: float | None = None  # when the object was last found to be another's
        self._left_out = 0
        self.writes = 0  # API writes, for tests
        self._init_loop()

    def desired(self) -> dict[str, Any]:
        """The object as it should be now (without the owner reference)."""
        zone_list, left_out = nrt.zones(
            self._inventory(), self._held(), self._numa_nodes(), host_resources=self.host_resources
        )
        if left_out != self._left_out:
            log_event(
                log,
                "node.nrt_devices_unplaced",
                logging.WARNING if left_out else logging.INFO,
                node=self.node_name,
                devices=left_out,
                reason="NUMA node unknown on a node with several (or none in sysfs)",
            )
            self._left_out = left_out
        return nrt.document(self.node_name, zone_list, self.policy, self.scope)

    def sync_once(self) -> str:
        """Write if due: returns ``created``, ``changed`` or ``refresh`` ('' when it did not write,
        also while the object is another writer's). API errors raise (NrtUnavailable when the CRD
        does not take the object)."""
        now = self._clock()
        if self._foreign_since is not None and now - self._foreign_since < self.refresh:
            return ""
        body = self.desired()
        wanted = content(body)
        if self.written == wanted and now - self._written_at < self.refresh:
            return ""
        if self.written is None:  # first write (or after another writer's object): look first
            existing = self._read()
            if existing is not None and not nrt.ours(existing):
                if self._foreign_since is None:
                    labels = (existing.get("metadata") or {}).get("labels") or {}
                    log_event(
                        log,
                        "node.nrt_not_ours",
                        logging.WARNING,
                        node=self.node_name,
                        writer=labels.get(nrt.MANAGED_BY, "unknown"),
                        action="left alone; checked again every refresh",
                    )
                self._foreign_since = now
                return ""
            reason = "created" if existing is None else "changed"
            wrote = self._create(body) if existing is None else self._patch(body)
        else:
            reason = "changed" if self.written != wanted else "refresh"
            wrote = self._patch(body)
        if not wrote:  # created or written meanwhile by someone: whose it is, the next round reads first
            self.written = None
            return ""
        if self._foreign_since is not None:
            log_event(log, "node.nrt_ours_again", node=self.node_name)
        self._foreign_since = None
        self.written, self._written_at = wanted, self._clock()
        if reason != "refresh":
            log_event(log, "node.nrt_published", node=self.node_name, reason=reason, zones=len(body["zones"]))
        return reason

    def _read(self) -> dict[str, Any] | None:
        try:
            found = self._custom.get_cluster_custom_object(nrt.GROUP, nrt.VERSION, nrt.PLURAL, self.node_name)
        except ApiException as error:
            if error.status == NOT_FOUND:
                return None  # no object (or no CRD: the create says which)
            raise
        self._version = _version(found)
        return dict(found)

    def _patch(self, body: dict[str, Any]) -> bool:
        """Merge-patch the object (create it when gone); False when someone else wrote it since we
        last did (the patch carries that write's resourceVersion: a 409) or a create lost a race."""
        metadata: dict[str, Any] = {"labels": body["metadata"]["labels"]}
        if self._version:
            metadata["resourceVersion"] = self._version
        patch = {"metadata": metadata, **content(body)}
        try:
            return self._written(
                lambda: self._custom.patch_cluster_custom_object(
                    nrt.GROUP, nrt.VERSION, nrt.PLURAL, self.node_name, patch, _content_type=MERGE_PATCH
                )
            )
        except ApiException as error:
            if error.status == NOT_FOUND:  # deleted behind our back: create it again
                return self._create(body)
            raise self._explained(error) from None

    def _create(self, body: dict[str, Any]) -> bool:
        """Create the object, owned by the Node; False when it was created meanwhile (409): by
        another writer, maybe, so nothing is taken as written."""
        owned = nrt.document(self.node_name, body["zones"], self.policy, self.scope, self._node_uid())
        try:
            return self._written(
                lambda: self._custom.create_cluster_custom_object(nrt.GROUP, nrt.VERSION, nrt.PLURAL, owned)
            )
        except ApiException as error:
            raise self._explained(error) from None

    def _written(self, write: Callable[[], Any]) -> bool:
        """Make one write and keep the resourceVersion it returns; False on a 409 (someone else
        wrote or created the object: its version is forgotten). Other API errors raise."""
        try:
            written = write()
        except ApiException as error:
            if error.status != CONFLICT:
                raise
            self._version = None
            return False
        self._version = _version(written)
        self.writes += 1
        return True

    def _explained(self, error: ApiException) -> Exception:
        """A clear error for what the CRD refuses; other API errors as they are."""
        if error.status == NOT_FOUND:
            return NrtUnavailable(
                f"the API serves no {nrt.KIND} {nrt.API_VERSION} (CRD {nrt.CRD_NAME} absent, or a copy "
                "without v1alpha2): create deploy/crds/topology.node.k8s.io_noderesourcetopologies.yaml"
            )
        if error.status in (400, 422):
            return NrtUnavailable(
                f"the API refused {nrt.KIND} {self.node_name} (is CRD {nrt.CRD_NAME} upstream's "
                f"schema?): {api_message(error)}"
            )
        return error

    def interval_seconds(self) -> float:
        return self.interval
