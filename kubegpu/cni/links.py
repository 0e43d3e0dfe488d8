"""Netlink work for kubegpu-cni, through pyroute2: moving VF netdevs between the host's network
namespace (the one the plugin runs in) and a pod's, and setting their bandwidth.

Bandwidth goes through one interface, ``BandwidthApplier``:

- ``VfRateApplier`` (``"bandwidth": "vf-rate"``, real SR-IOV): the PF's ``IFLA_VF_RATE`` for the VF
  (``ip link set <pf> vf N min_tx_rate A max_tx_rate B``), Mbit/s, set in the host namespace where
  the PF stays; cleared (0/0) when the VF comes back;
- ``TcApplier`` (``"bandwidth": "tc"``, for netdevs that are no VFs, as the tests' stand-ins): an
  HTB root qdisc on the interface inside the pod, one class with ``rate`` = the minimum and
  ``ceil`` = the maximum (10 Tbit/s when uncapped). Qdiscs go away with a namespace move, so the
  return needs no clearing.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Protocol

from pyroute2 import IPRoute
from pyroute2.netlink.exceptions import NetlinkError

from kubegpu.bandwidth import MAX_MBPS
from kubegpu.cni.state import Attachment

UNCAPPED_MBPS = MAX_MBPS  # the allocation's bound: what "no cap" means for tc
NS_GET_NSTYPE = 0xB703  # ioctl on an nsfs file: its namespace type (linux/nsfs.h)
CLONE_NEWNET = 0x40000000


class LinkError(Exception):
    """A netlink operation failed; the message names the interface and the namespace."""


def _why(error: Exception) -> str:
    if isinstance(error, NetlinkError):
        return f"{os.strerror(error.code)} (errno {error.code})"
    if isinstance(error, OSError):
        return error.strerror or str(error)
    return str(error)


@contextmanager
def netlink(netns: str | None = None) -> Iterator[IPRoute]:
    """An rtnetlink socket in ``netns`` (a path), or in this process's namespace."""
    try:
        handle = IPRoute(netns=netns) if netns else IPRoute()
    except (OSError, NetlinkError) as error:
        raise LinkError(f"cannot open network namespace {netns}: {_why(error)}") from None
    try:
        yield handle
    finally:
        handle.close()


def netns_exists(path: str) -> bool:
    """Whether ``path`` names a live network namespace (a bind mount or /proc/PID/ns/net)."""
    if not path:
        return False
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        return fcntl.ioctl(fd, NS_GET_NSTYPE) == CLONE_NEWNET
    except OSError:  # not an nsfs file (a leftover plain file where the bind mount was)
        return False
    finally:
        os.close(fd)


def is_own_netns(path: str) -> bool:
    """Whether ``path`` names this process's own network namespace (the host's, for the plugin):
    ``/proc/self/ns/net``, ``/proc/1/ns/net`` on the host, a bind mount of it, ..."""
    try:
        theirs, ours = os.stat(path), os.stat("/proc/self/ns/net")
    except OSError:
        return False
    return (theirs.st_dev, theirs.st_ino) == (ours.st_dev, ours.st_ino)


def find(handle: IPRoute, ifname: str) -> Any | None:
    """The link called ``ifname`` in ``handle``'s namespace, or None."""
    indexes = handle.link_lookup(ifname=ifname)
    return handle.get_links(indexes[0])[0] if indexes else None


def mac_of(link: Any) -> str:
    return str(link.get_attr("IFLA_ADDRESS") or "")


def _move(handle: IPRoute, index: int, target: str, new_name: str, where: str) -> None:
    fd = os.open(target, os.O_RDONLY | os.O_CLOEXEC)
    try:
        handle.link("set", index=index, state="down")
        handle.link("set", index=index, net_ns_fd=fd, ifname=new_name)
    except NetlinkError as error:
        raise LinkError(f"moving {where} to {new_name}: {_why(error)}") from None
    finally:
        os.close(fd)


def move_into_pod(host_ifname: str, netns: str, pod_ifname: str) -> str:
    """Move host netdev ``host_ifname`` into ``netns`` as ``pod_ifname``, up; return its MAC.

    The name is checked free in the pod first: the kernel moves a device before renaming it, so a
    taken name would leave it in the pod under its host name (``move_to_host`` looks for that too).
    """
    with netlink(netns) as pod:
        if find(pod, pod_ifname) is not None:
            raise LinkError(f"{netns} already has an interface called {pod_ifname}")
    with netlink() as host:
        link = find(host, host_ifname)
        if link is None:
            raise LinkError(f"netdev {host_ifname} is not in the host namespace")
        mac = mac_of(link)
        _move(host, link["index"], netns, pod_ifname, f"{host_ifname} into {netns}")
    with netlink(netns) as pod:
        link = find(pod, pod_ifname)
        if link is None:
            raise LinkError(f"{pod_ifname} did not arrive in {netns}")
        try:
            pod.link("set", index=link["index"], state="up")
        except NetlinkError as error:
            raise LinkError(f"setting {pod_ifname} up in {netns}: {_why(error)}") from None
    return mac


def in_pod(netns: str, pod_ifname: str, mac: str) -> bool:
    """Whether ``netns`` holds ``pod_ifname`` with ``mac``."""
    with netlink(netns) as pod:
        link = find(pod, pod_ifname)
        return link is not None and (not mac or mac_of(link) == mac)


def move_to_host(netns: str, pod_ifname: str, mac: str, host_ifname: str) -> bool:
    """Move the VF out of ``netns`` back into this namespace as ``host_ifname``; False if the pod's
    namespace has it neither as ``pod_ifname`` nor (a move whose rename failed) as ``host_ifname``,
    with ``mac``."""
    with netlink(netns) as pod:
        for name in (pod_ifname, host_ifname):
            link = find(pod, name)
            if link is not None and (not mac or mac_of(link) == mac):
                _move(pod, link["index"], "/proc/self/ns/net", host_ifname, f"{name} out of {netns}")
                return True
    return False


def rename_in_host(current: str, host_ifname: str) -> None:
    """Rename host netdev ``current`` (a VF the kernel returned when its pod's namespace died)."""
    if current == host_ifname:
        return
    with netlink() as host:
        link = find(host, current)
        if link is None:
            raise LinkError(f"netdev {current} is not in the host namespace")
        try:
            host.link("set", index=link["index"], state="down")
            host.link("set", index=link["index"], ifname=host_ifname)
        except NetlinkError as error:
            raise LinkError(f"renaming {current} to {host_ifname}: {_why(error)}") from None


def host_has(ifname: str, mac: str) -> bool:
    """Whether this namespace has ``ifname`` (with ``mac``, when given)."""
    with netlink() as host:
        link = find(host, ifname)
        return link is not None and (not mac or mac_of(link) == mac)


# --- bandwidth --------------------------------------------------------------------------------


class BandwidthApplier(Protocol):
    """Sets (and clears) one VF's bandwidth; raises LinkError naming what failed."""

    name: str

    def apply(self, attachment: Attachment, netns: str) -> None: ...

    def clear(self, attachment: Attachment) -> None: ...

    def check(self, attachment: Attachment, netns: str) -> str | None:
        """What differs from the attachment's bandwidth, or None."""
        ...


class VfRateApplier:
    """The PF's per-VF tx rate (IFLA_VF_RATE), Mbit/s; 0 means no limit."""

    name = "vf-rate"

    def _set(self, attachment: Attachment, low: int, high: int) -> None:
        if not attachment.pf_ifname:
            raise LinkError(f"PF {attachment.pf} of VF {attachment.device} has no netdev to set the rate on")
        with netlink() as host:
            pf = find(host, attachment.pf_ifname)
            if pf is None:
                raise LinkError(f"PF netdev {attachment.pf_ifname} is not in the host namespace")
            rate = {"min_tx_rate": low, "max_tx_rate": high}
            try:
                host.link("set", index=pf["index"], vf={"vf": attachment.vf_index, "rate": rate})
            except NetlinkError as error:
                raise LinkError(
                    f"setting VF {attachment.vf_index} of {attachment.pf_ifname} to min {low} max {high} "
                    f"Mbit/s: {_why(error)}"
                ) from None

    def apply(self, attachment: Attachment, netns: str) -> None:
        self._set(attachment, attachment.min_mbps, attachment.max_mbps)

    def clear(self, attachment: Attachment) -> None:
        self._set(attachment, 0, 0)

    def check(self, attachment: Attachment, netns: str) -> str | None:
        with netlink() as host:
            pf = find(host, attachment.pf_ifname)
            if pf is None:
                return f"PF netdev {attachment.pf_ifname} is not in the host namespace"
            links = host.get_links(pf["index"], ext_mask=1)  # RTEXT_FILTER_VF
        infos = links[0].get_attr("IFLA_VFINFO_LIST")
        for info in infos.get_attrs("IFLA_VF_INFO") if infos else []:
            rate = info.get_attr("IFLA_VF_RATE")
            if rate and rate["vf"] == attachment.vf_index:
                got = (rate["min_tx_rate"], rate["max_tx_rate"])
                want = (attachment.min_mbps, attachment.max_mbps)
                return None if got == want else f"VF {attachment.device} rate is {got}, not {want}"
        return f"PF {attachment.pf_ifname} reports no rate for VF {attachment.vf_index}"


class TcApplier:
    """An HTB class on the interface in the pod: rate = minimum, ceil = maximum (or uncapped)."""

    name = "tc"

    @staticmethod
    def _ceil(attachment: Attachment) -> int:
        return attachment.max_mbps or UNCAPPED_MBPS

    def apply(self, attachment: Attachment, netns: str) -> None:
        with netlink(netns) as pod:
            link = find(pod, attachment.pod_ifname)
            if link is None:
                raise LinkError(f"{attachment.pod_ifname} is not in {netns}")
            rate, ceil = max(attachment.min_mbps, 1), self._ceil(attachment)
            try:
                pod.tc("add", "htb", index=link["index"], handle="1:", default=1)
                pod.tc(
                    "add-class",
                    "htb",
                    index=link["index"],
                    handle="1:1",
                    parent="1:",
                    rate=f"{rate}mbit",
                    ceil=f"{ceil}mbit",
                )
            except NetlinkError as error:
                raise LinkError(f"tc htb on {attachment.pod_ifname} in {netns}: {_why(error)}") from None

    def clear(self, attachment: Attachment) -> None:
        """Nothing: the qdisc went away when the interface left the pod's namespace."""

    def check(self, attachment: Attachment, netns: str) -> str | None:
        with netlink(netns) as pod:
            link = find(pod, attachment.pod_ifname)
            if link is None:
                return f"{attachment.pod_ifname} is not in {netns}"
            classes = pod.get_classes(index=link["index"])
        for cls in classes:
            if cls.get_attr("TCA_KIND") == "htb" and cls["handle"] == 0x10001:
                parms = cls.get_nested("TCA_OPTIONS", "TCA_HTB_PARMS")
                rate = cls.get_nested("TCA_OPTIONS", "TCA_HTB_RATE64") or parms["rate"]
                ceil = cls.get_nested("TCA_OPTIONS", "TCA_HTB_CEIL64") or parms["ceil"]
                got = (rate * 8 // 1_000_000, ceil * 8 // 1_000_000)
                want = (max(attachment.min_mbps, 1), self._ceil(attachment))
                return None if got == want else f"{attachment.pod_ifname} htb rate/ceil is {got}, not {want}"
        return f"{attachment.pod_ifname} has no kubegpu htb class"


def applier(mode: str) -> BandwidthApplier:
    """The applier for the config's ``bandwidth`` field."""
    return TcApplier() if mode == "tc" else VfRateApplier()
