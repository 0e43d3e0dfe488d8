"""kubegpu-cni's commands: ADD, DEL, CHECK, STATUS and GC on a parsed request (docs/cni.md).

ADD moves the pod's allocated VF netdevs into its network namespace, named ``<prefix>0..``, up,
with their bandwidth, and appends them to the previous plugin's result; a pod without VFs passes
through (the plugin is chained for every pod). Any failure rolls back what it had moved. DEL gives
them back under their host names, also when the pod's namespace is gone. Every command that
touches VFs holds the node-wide lock of the state directory.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Iterable
from typing import Any

from devices.rdmanet import VfLookupError, current_ifname, read_vf_netdev
from kubegpu.allocation import ANNOTATION, RdmaInterface
from kubegpu.cni import links
from kubegpu.cni.podalloc import decide, node_keys, read_annotations
from kubegpu.cni.protocol import (
    ATTACH_FAILED,
    CHECK_FAILED,
    INVALID_CONFIG,
    INVALID_ENVIRONMENT,
    NOT_AVAILABLE,
    VALID_ATTACHMENTS,
    VF_HELD,
    VF_UNAVAILABLE,
    CniError,
    Request,
    chained_result,
    version_result,
)
from kubegpu.cni.state import Attachment, Record, StateDir, record_summary
from kubegpu.logs import log_event

log = logging.getLogger("kubegpu.cni")


def node_name(request: Request) -> str:
    return request.config.node_name or socket.gethostname().lower()


def run(request: Request) -> dict[str, Any] | None:
    """The command's result document (None: no output, as STATUS and DEL)."""
    if request.command == "VERSION":
        return version_result(request.cni_version)
    if request.command == "STATUS":
        problem = StateDir(request.config.state_dir).status_problem()
        if problem:
            raise CniError(NOT_AVAILABLE, problem)
        return None
    if request.command == "ADD":
        return add(request)
    if request.command == "DEL":
        delete(request)
        return None
    if request.command == "CHECK":
        check(request)
        return None
    gc(request)
    return None


def _passthrough(request: Request, why: str) -> dict[str, Any]:
    log_event(
        log,
        "cni.passthrough",
        level=logging.DEBUG,
        container=request.container_id,
        pod=str(request.pod) if request.pod else None,
        why=why,
    )
    return chained_result(request.cni_version, request.prev_result, [])


def allocated_vfs(request: Request) -> tuple[RdmaInterface, ...]:
    """The VFs the pod's verified allocation gives it on this node (empty: none)."""
    if request.pod is None:
        return ()
    found = read_annotations(
        request.pod, request.pod_annotations(), request.config.kubeconfig, request.config.api_timeout
    )
    keys = node_keys(request.config.keys_dir) if ANNOTATION in found.annotations else {}
    return decide(request.pod, found, keys, node_name(request))


def _interfaces(record: Record) -> list[dict[str, Any]]:
    return [{"name": a.pod_ifname, "mac": a.mac, "sandbox": record.netns} for a in record.attachments]


def add(request: Request) -> dict[str, Any]:
    vfs = allocated_vfs(request)
    if not vfs:
        return _passthrough(request, "the pod holds no RDMA VF")
    if links.is_own_netns(request.netns):
        raise CniError(
            INVALID_ENVIRONMENT,
            f"pod {request.pod}: CNI_NETNS {request.netns[:200]} is the host's own network namespace: "
            "its VFs would stay in the host",
        )
    state = StateDir(request.config.state_dir)
    with state.locked(request.config.lock_timeout):
        existing = state.load(request.container_id)
        if existing is not None:
            if _same_attachment(request, existing, vfs) and not _check_problems(request, existing):
                log_event(log, "cni.add_repeated", **record_summary(existing))
                return chained_result(request.cni_version, request.prev_result, _interfaces(existing))
            release(request, existing, state)  # half done or stale: undo, then attach afresh
        record = _plan(request, vfs, state)
        state.save(record)
        applier = links.applier(request.config.bandwidth)
        try:
            for attachment in record.attachments:
                links.move_into_pod(attachment.host_ifname, request.netns, attachment.pod_ifname)
                applier.apply(attachment, request.netns)
        except links.LinkError as error:
            problems = _release_all(request, record.attachments, record.netns)
            if not problems:
                state.remove(request.container_id)
            log_event(
                log,
                "cni.add_failed",
                logging.WARNING,
                error=str(error),
                rollback_problems=problems or None,
                **record_summary(record),
            )
            raise CniError(ATTACH_FAILED, f"pod {request.pod}: {error} (rolled back)") from None
        record.phase = "attached"
        state.save(record)
    log_event(
        log,
        "cni.attached",
        netns=request.netns,
        bandwidth=applier.name,
        ifnames=[a.pod_ifname for a in record.attachments],
        **record_summary(record),
    )
    return chained_result(request.cni_version, request.prev_result, _interfaces(record))


def _same_attachment(request: Request, record: Record, vfs: Iterable[RdmaInterface]) -> bool:
    return (
        record.phase == "attached"
        and record.netns == request.netns
        and [a.device for a in record.attachments] == [v.device for v in vfs]
    )


def _plan(request: Request, vfs: tuple[RdmaInterface, ...], state: StateDir) -> Record:
    """The attachments ADD will make, each VF checked to be here and free; CniError if not."""
    assert request.pod is not None
    holders = state.holders()
    attachments: list[Attachment] = []
    for k, vf in enumerate(vfs):
        holder = holders.get(vf.device)
        if holder is not None:
            raise CniError(VF_HELD, f"pod {request.pod}: VF {vf.device} is attached to container {holder}")
        try:
            netdev = read_vf_netdev(request.config.sysfs_root, vf.device, vf.pf)
        except VfLookupError as error:
            raise CniError(VF_UNAVAILABLE, f"pod {request.pod}: {error}") from None
        with links.netlink() as host:
            link = links.find(host, netdev.ifname)
        if link is None:
            raise CniError(
                VF_UNAVAILABLE,
                f"pod {request.pod}: VF {vf.device}'s netdev {netdev.ifname} is not on the host",
            )
        attachments.append(
            Attachment(
                device=vf.device,
                pf=vf.pf,
                pci=netdev.pci,
                host_ifname=netdev.ifname,
                pod_ifname=f"{request.config.ifname_prefix}{k}",
                mac=links.mac_of(link),
                pf_ifname=netdev.pf_ifname,
                vf_index=netdev.vf_index,
                min_mbps=vf.min_mbps,
                max_mbps=vf.max_mbps or _default_cap(request.config.default_max_mbps, vf.min_mbps),
            )
        )
    return Record(
        container_id=request.container_id,
        ifname=request.ifname,
        netns=request.netns,
        pod=str(request.pod),
        pod_uid=request.pod.uid,
        phase="attaching",
        attachments=attachments,
    )


def _default_cap(default_max_mbps: int, min_mbps: int) -> int:
    """The cap of a VF whose allocation gives none: the config's ``defaultMaxRate`` (0: none), never
    below the minimum the scheduler reserved for it (the kernel refuses a min_tx_rate above the
    max_tx_rate)."""
    return max(default_max_mbps, min_mbps) if default_max_mbps else 0


def _release_one(request: Request, attachment: Attachment, netns: str) -> str | None:
    """Bring one VF home under its host name; what went wrong, or None (home, or gone for good)."""
    try:
        if not links.host_has(attachment.host_ifname, attachment.mac):
            moved = links.netns_exists(netns) and links.move_to_host(
                netns, attachment.pod_ifname, attachment.mac, attachment.host_ifname
            )
            if not moved:
                # the pod's namespace died: the kernel gave a physical VF back to the host, maybe renamed
                current = current_ifname(request.config.sysfs_root, attachment.device)
                if current and links.host_has(current, ""):
                    links.rename_in_host(current, attachment.host_ifname)
                else:
                    log_event(
                        log,
                        "cni.vf_not_found",
                        logging.WARNING,
                        vf=attachment.device,
                        host_ifname=attachment.host_ifname,
                        netns=netns,
                    )
                    return None
    except links.LinkError as error:
        return str(error)
    try:  # hygiene only: the next pod given this VF sets both rates anyway
        links.applier(request.config.bandwidth).clear(attachment)
    except links.LinkError as error:
        log_event(log, "cni.rate_not_cleared", logging.WARNING, vf=attachment.device, error=str(error))
    return None


def _release_all(request: Request, attachments: Iterable[Attachment], netns: str) -> list[str]:
    return [p for a in attachments if (p := _release_one(request, a, netns)) is not None]


def release(request: Request, record: Record, state: StateDir) -> None:
    """Give a record's VFs back and forget it; CniError (record kept, so DEL can be retried) if
    any could not be brought back."""
    problems = _release_all(request, record.attachments, record.netns)
    if problems:
        log_event(log, "cni.release_failed", logging.WARNING, problems=problems, **record_summary(record))
        raise CniError(ATTACH_FAILED, f"container {record.container_id}: {'; '.join(problems)}")
    state.remove(record.container_id)
    log_event(log, "cni.released", **record_summary(record))


def delete(request: Request) -> None:
    """DEL: idempotent; needs only the record (not the pod, its allocation, or its namespace)."""
    state = StateDir(request.config.state_dir)
    with state.locked(request.config.lock_timeout):
        record = state.load(request.container_id)
        if record is not None:
            release(request, record, state)


def _check_problems(request: Request, record: Record) -> list[str]:
    problems: list[str] = []
    applier = links.applier(request.config.bandwidth)
    for a in record.attachments:
        try:
            if not links.in_pod(request.netns, a.pod_ifname, a.mac):
                problems.append(f"{a.pod_ifname} ({a.device}) is not in {request.netns}")
                continue
            problem = applier.check(a, request.netns)
        except links.LinkError as error:
            problem = str(error)
        if problem:
            problems.append(problem)
    return problems


def check(request: Request) -> None:
    """CHECK: the pod's VFs are in its namespace under their names, with their bandwidth."""
    vfs = allocated_vfs(request)
    state = StateDir(request.config.state_dir)
    with state.locked(request.config.lock_timeout):
        record = state.load(request.container_id)
    if not vfs and record is None:
        return
    if record is None or not _same_attachment(request, record, vfs):
        raise CniError(CHECK_FAILED, f"pod {request.pod}: its VFs {[v.device for v in vfs]} are not attached")
    problems = _check_problems(request, record)
    if problems:
        raise CniError(CHECK_FAILED, f"pod {request.pod}: {'; '.join(problems)}")


def gc(request: Request) -> None:
    """GC: release every record whose (container id, ifname) the runtime no longer lists."""
    valid = request.netconf.get(VALID_ATTACHMENTS)
    if not isinstance(valid, list) or not all(isinstance(v, dict) for v in valid):
        raise CniError(INVALID_CONFIG, f"GC needs {VALID_ATTACHMENTS}, a list of objects")
    keep = {(str(v.get("containerID")), str(v.get("ifname"))) for v in valid}
    state = StateDir(request.config.state_dir)
    problems: list[str] = []
    with state.locked(request.config.lock_timeout):
        for record in state.records():
            if (record.container_id, record.ifname) not in keep:
                try:
                    release(request, record, state)
                except CniError as error:
                    problems.append(error.msg)
    if problems:
        raise CniError(ATTACH_FAILED, "; ".join(problems))
