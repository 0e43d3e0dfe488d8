"""The CNI protocol as kubegpu-cni speaks it: the request (environment + network config on stdin),
the plugin's configuration fields, errors with their codes, and results. Pure: no I/O here.

CNI spec 1.0.0 and 1.1.0 (https://github.com/containernetworking/cni/blob/main/SPEC.md): the
runtime sets ``CNI_COMMAND`` (ADD, DEL, CHECK, VERSION, STATUS, GC), ``CNI_CONTAINERID``,
``CNI_NETNS``, ``CNI_IFNAME``, ``CNI_ARGS`` and ``CNI_PATH``, and writes the network config (with
``prevResult`` and ``runtimeConfig`` inserted) on stdin. docs/cni.md describes the fields.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from kubegpu.bandwidth import parse_bandwidth

SUPPORTED_VERSIONS = ("1.0.0", "1.1.0")
STATUS_VERSIONS = ("1.1.0",)  # STATUS and GC exist from 1.1.0 on
POD_ANNOTATIONS_CAPABILITY = "io.kubernetes.cri.pod-annotations"
VALID_ATTACHMENTS = "cni.dev/valid-attachments"  # GC's list of attachments to keep

# Error codes (the spec reserves 1-99; 100+ are this plugin's own).
INCOMPATIBLE_VERSION = 1
UNSUPPORTED_FIELD = 2
UNKNOWN_CONTAINER = 3
INVALID_ENVIRONMENT = 4
IO_FAILURE = 5
DECODE_FAILURE = 6
INVALID_CONFIG = 7
TRY_AGAIN_LATER = 11
NOT_AVAILABLE = 50  # STATUS: the plugin cannot serve ADD now
ALLOCATION_REJECTED = 100  # the pod's allocation is unsigned, badly signed, or not for this pod/node
POD_UNKNOWN = 101  # the pod (or its annotations) could not be read
VF_UNAVAILABLE = 102  # an allocated VF is not on this node now (vanished from sysfs, netdev gone)
VF_HELD = 103  # an allocated VF is attached to another container
ATTACH_FAILED = 104  # netlink refused a move, a rename or a bandwidth setting
CHECK_FAILED = 105  # CHECK: an interface is not where ADD put it
RDMA_UNALLOCATED = 106  # the pod asks for RDMA interfaces but its allocation holds none

DEFAULTS: dict[str, Any] = {
    "nodeName": None,  # default: the hostname in lowercase (as kubelet's and the shim's)
    "keysDir": "/etc/kubegpu/keys",
    "stateDir": "/var/lib/kubegpu/cni",
    "sysfsRoot": "/",
    "kubeconfig": None,
    "ifnamePrefix": "rdma",
    "bandwidth": "vf-rate",
    "defaultMaxRate": None,
    "apiTimeoutSeconds": 5.0,
    "lockTimeoutSeconds": 60.0,
}
BANDWIDTH_MODES = ("vf-rate", "tc")
_IFNAME_PREFIX = re.compile(r"^[a-z][a-z0-9]{0,9}$")  # + up to 2 digits stays within IFNAMSIZ
_CONTAINER_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,255}$")


class CniError(Exception):
    """A failed call: the CNI error code, a message, and optional details (CNI error JSON)."""

    def __init__(self, code: int, msg: str, details: str = "") -> None:
        super().__init__(msg)
        self.code, self.msg, self.details = code, msg, details

    def to_document(self, cni_version: str) -> dict[str, Any]:
        doc: dict[str, Any] = {"cniVersion": cni_version, "code": self.code, "msg": self.msg}
        if self.details:
            doc["details"] = self.details
        return doc


@dataclass(frozen=True)
class PluginConfig:
    """The plugin's own fields of the network config (docs/cni.md)."""

    node_name: str | None
    keys_dir: str
    state_dir: str
    sysfs_root: str
    kubeconfig: str | None
    ifname_prefix: str
    bandwidth: str
    default_max_mbps: int
    api_timeout: float
    lock_timeout: float


@dataclass(frozen=True)
class PodRef:
    """The pod from CNI_ARGS (``K8S_POD_NAMESPACE``, ``K8S_POD_NAME``, ``K8S_POD_UID``)."""

    namespace: str
    name: str
    uid: str = ""

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True)
class Request:
    """One call: the command, the environment's facts, and the network config."""

    command: str
    cni_version: str
    container_id: str
    netns: str
    ifname: str
    pod: PodRef | None
    config: PluginConfig
    netconf: Mapping[str, Any] = field(default_factory=dict)

    @property
    def prev_result(self) -> Mapping[str, Any] | None:
        prev = self.netconf.get("prevResult")
        return prev if isinstance(prev, Mapping) else None

    @property
    def runtime_config(self) -> Mapping[str, Any]:
        rc = self.netconf.get("runtimeConfig")
        return rc if isinstance(rc, Mapping) else {}

    def pod_annotations(self) -> Mapping[str, str] | None:
        """The pod's annotations as the runtime passed them (capability
        ``io.kubernetes.cri.pod-annotations``), or None if it passed none."""
        value = self.runtime_config.get(POD_ANNOTATIONS_CAPABILITY)
        if not isinstance(value, Mapping):
            return None
        return {str(k): str(v) for k, v in value.items() if isinstance(v, str)}


def parse_cni_args(text: str) -> dict[str, str]:
    """``IgnoreUnknown=1;K8S_POD_NAME=x`` -> {"IgnoreUnknown": "1", "K8S_POD_NAME": "x"}."""
    out: dict[str, str] = {}
    for part in text.split(";"):
        if not part:
            continue
        key, sep, value = part.partition("=")
        if not sep or not key:
            raise CniError(INVALID_ENVIRONMENT, f"CNI_ARGS: {part[:80]!r} is not KEY=VALUE")
        out[key] = value
    return out


def pod_ref(cni_args: Mapping[str, str]) -> PodRef | None:
    namespace, name = cni_args.get("K8S_POD_NAMESPACE", ""), cni_args.get("K8S_POD_NAME", "")
    if not namespace or not name:
        return None
    return PodRef(namespace, name, cni_args.get("K8S_POD_UID", ""))


def _mbps(text: Any) -> int:
    """A single bandwidth figure (``100Gbps``, ``500Mbps``) in Mbit/s, or CniError."""
    try:
        low, high = parse_bandwidth(text)
    except ValueError as error:
        raise CniError(INVALID_CONFIG, f"defaultMaxRate: {error}") from None
    if high or low <= 0:
        raise CniError(INVALID_CONFIG, f"defaultMaxRate: {str(text)[:64]!r} must be one rate above 0")
    return low


def plugin_config(netconf: Mapping[str, Any]) -> PluginConfig:
    """The plugin's fields with defaults; CniError(INVALID_CONFIG) naming a bad one."""
    values = {k: netconf.get(k, v) for k, v in DEFAULTS.items()}
    for key in ("keysDir", "stateDir", "sysfsRoot"):
        if not isinstance(values[key], str) or not values[key].startswith("/"):
            raise CniError(INVALID_CONFIG, f"{key} must be an absolute path")
    for key in ("kubeconfig", "nodeName"):
        if values[key] is not None and (not isinstance(values[key], str) or not values[key]):
            raise CniError(INVALID_CONFIG, f"{key} must be a non-empty string")
    if not isinstance(values["ifnamePrefix"], str) or not _IFNAME_PREFIX.fullmatch(values["ifnamePrefix"]):
        raise CniError(
            INVALID_CONFIG, "ifnamePrefix must be 1-10 lowercase letters and digits, a letter first"
        )
    if values["bandwidth"] not in BANDWIDTH_MODES:
        raise CniError(
            INVALID_CONFIG,
            f"bandwidth {str(values['bandwidth'])[:40]!r} is not one of {', '.join(BANDWIDTH_MODES)}",
        )
    for key in ("apiTimeoutSeconds", "lockTimeoutSeconds"):
        if type(values[key]) not in (int, float) or not 0 < values[key] <= 600:
            raise CniError(INVALID_CONFIG, f"{key} must be a number of seconds in (0, 600]")
    default_max = values["defaultMaxRate"]
    return PluginConfig(
        node_name=values["nodeName"],
        keys_dir=values["keysDir"],
        state_dir=values["stateDir"],
        sysfs_root=values["sysfsRoot"],
        kubeconfig=values["kubeconfig"],
        ifname_prefix=values["ifnamePrefix"],
        bandwidth=values["bandwidth"],
        default_max_mbps=_mbps(default_max) if default_max is not None else 0,
        api_timeout=float(values["apiTimeoutSeconds"]),
        lock_timeout=float(values["lockTimeoutSeconds"]),
    )


def parse_request(env: Mapping[str, str], stdin: bytes) -> Request:
    """The call described by ``env`` and ``stdin``; CniError with the spec's code if it is malformed."""
    command = env.get("CNI_COMMAND", "")
    if command not in ("ADD", "DEL", "CHECK", "VERSION", "STATUS", "GC"):
        raise CniError(INVALID_ENVIRONMENT, f"CNI_COMMAND {command[:20]!r} is not a CNI command")
    try:
        netconf = json.loads(stdin or b"{}")
    except (ValueError, RecursionError) as error:
        raise CniError(DECODE_FAILURE, f"network config is not JSON: {error}") from None
    if not isinstance(netconf, dict):
        raise CniError(DECODE_FAILURE, "network config is not a JSON object")
    version = netconf.get("cniVersion", "")
    if command == "VERSION":
        return Request(command, str(version) or SUPPORTED_VERSIONS[-1], "", "", "", None, plugin_config({}))
    if version not in SUPPORTED_VERSIONS:
        raise CniError(
            INCOMPATIBLE_VERSION,
            f"cniVersion {str(version)[:20]!r} is not supported (supported: {', '.join(SUPPORTED_VERSIONS)})",
        )
    if command in ("STATUS", "GC") and version not in STATUS_VERSIONS:
        raise CniError(INCOMPATIBLE_VERSION, f"{command} needs cniVersion 1.1.0, the config says {version}")
    config = plugin_config(netconf)
    if command in ("STATUS", "GC"):
        return Request(command, version, "", "", "", None, config, netconf)
    container_id = env.get("CNI_CONTAINERID", "")
    if not _CONTAINER_ID.fullmatch(container_id):
        raise CniError(INVALID_ENVIRONMENT, "CNI_CONTAINERID is missing or not a container id")
    netns, ifname = env.get("CNI_NETNS", ""), env.get("CNI_IFNAME", "")
    if command in ("ADD", "CHECK") and not netns.startswith("/"):
        raise CniError(INVALID_ENVIRONMENT, f"CNI_NETNS must be a path for {command}")
    if not ifname:
        raise CniError(INVALID_ENVIRONMENT, "CNI_IFNAME is missing")
    pod = pod_ref(parse_cni_args(env.get("CNI_ARGS", "")))
    _check_prev_result(netconf)
    return Request(command, version, container_id, netns, ifname, pod, config, netconf)


def _check_prev_result(netconf: Mapping[str, Any]) -> None:
    """CniError(DECODE_FAILURE) unless ``prevResult``, when given, is an object whose
    ``interfaces`` (when given) is a list: ADD appends to it and passes it on."""
    if "prevResult" not in netconf:
        return
    prev = netconf["prevResult"]
    if not isinstance(prev, dict):
        raise CniError(DECODE_FAILURE, "prevResult is not a JSON object")
    if prev.get("interfaces") is not None and not isinstance(prev["interfaces"], list):
        raise CniError(DECODE_FAILURE, "prevResult.interfaces is not a list")


def version_result(cni_version: str) -> dict[str, Any]:
    """VERSION's answer."""
    return {"cniVersion": cni_version, "supportedVersions": list(SUPPORTED_VERSIONS)}


def chained_result(
    cni_version: str, prev: Mapping[str, Any] | None, interfaces: list[dict[str, Any]]
) -> dict[str, Any]:
    """The ADD result: the previous plugin's result with ``interfaces`` appended (its ips and routes
    keep their interface indexes, which point before the appended ones)."""
    result: dict[str, Any] = dict(prev or {})
    result["cniVersion"] = cni_version
    result["interfaces"] = [*list(result.get("interfaces") or []), *interfaces]
    return result
