"""The scheduler's configuration file (YAML) and its defaults; see docs/scheduler.md."""

from __future__ import annotations

import math
import re
import socket
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import yaml

from kubegpu.cliargs import DNS_SUBDOMAIN, MAX_SECONDS, WILDCARD_HOSTS, split_host_port
from kubegpu.inputfiles import read_text


class ConfigError(ValueError):
    """The configuration file is malformed; the message names the key."""


@dataclass
class LeaderElection:
    enabled: bool = False
    namespace: str = "kubegpu-system"
    lease_name: str = "kubegpu-scheduler"
    lease_seconds: float = 15.0
    renew_deadline_seconds: float = 10.0
    retry_period_seconds: float = 2.0


@dataclass
class SchedulerConfig:
    scheduler_name: str = "kubegpu"
    gpu_resource: str = "nvidia.com/gpu"
    signing_key_id: str = "k1"
    keys_dir: str = "/etc/kubegpu/keys"
    heartbeat_stale_seconds: float = 120.0
    policy: str = "topology"
    metrics_address: str | None = None
    bind_workers: int = 16
    backoff_initial_seconds: float = 1.0
    backoff_max_seconds: float = 10.0
    bind_timeout_seconds: float = 5.0
    identity: str = field(default_factory=socket.gethostname)
    # gang scheduling (docs/gang.md): how long a group may try before it is reported and backed
    # off (when its PodGroup names no timeout), the label of the topology domain a group is kept
    # in, how long a group waits before pods queued behind it stop taking the GPUs it needs, and
    # how long a group with fewer members than its minimum waits silently for the rest to arrive
    gang_timeout_seconds: float = 60.0
    gang_domain_label: str = "topology.kubernetes.io/zone"
    gang_starvation_seconds: float = 300.0
    gang_member_grace_seconds: float = 10.0
    # serve kube-scheduler's extender protocol too, from this replica's cache (docs/extender.md):
    # HOST:PORT, and a PEM certificate and key for HTTPS (both or neither)
    extender_address: str | None = None
    extender_tls_cert_file: str | None = None
    extender_tls_private_key_file: str | None = None
    # HOST:PORT where the other replicas reach this one's extender (a standby relays the verbs to
    # the leader there); default: $POD_IP with extenderAddress's port
    extender_advertise_address: str | None = None
    # utilisation-aware placement (docs/utilisation.md): the weight of the live utilisation term
    # added to ``policy`` (0: none), and the age past which a node's published readings are unknown
    utilization_weight: float = 0.0
    utilization_stale_seconds: float = 600.0
    leader_election: LeaderElection = field(default_factory=LeaderElection)


def _camel(name: str) -> str:
    first, *rest = name.split("_")
    return first + "".join(part.title() for part in rest)


def _keys(cls: type) -> dict[str, str]:
    """File key (camelCase, as Kubernetes configs spell them) -> dataclass field."""
    return {_camel(f.name): f.name for f in fields(cls)}


_CAMEL = _keys(SchedulerConfig)
_LEADER_CAMEL = _keys(LeaderElection)


def _apply(target: Any, doc: dict[str, Any], names: dict[str, str], where: str) -> None:
    types = {f.name: f.type for f in fields(target)}
    for key, value in doc.items():
        attr = names.get(key)
        if attr is None:
            raise ConfigError(f"{where}: unknown key {key!r} (known: {', '.join(sorted(names))})")
        current = getattr(target, attr)
        if isinstance(current, LeaderElection):
            if not isinstance(value, dict):
                raise ConfigError(f"{where}.{key} must be a mapping")
            _apply(current, value, _LEADER_CAMEL, f"{where}.{key}")
            continue
        expected = type(current) if current is not None else str
        if expected is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if not isinstance(value, expected) or (expected is int and isinstance(value, bool)):
            raise ConfigError(f"{where}.{key} must be {types[attr]}, got {value!r}")
        setattr(target, attr, value)


EXTENDED_RESOURCE = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?/[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
MAX_BIND_WORKERS = 1024
MAX_UTILIZATION_WEIGHT = 1000.0  # the weight of the live term; 1000 already puts it above every other score
LABEL_KEY = re.compile(r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")


def _problems(target: Any, where: str) -> list[str]:
    """Every ``*_seconds`` a finite duration above 0; every ``*_workers`` at least 1."""
    problems = []
    for f in fields(target):
        value, key = getattr(target, f.name), f"{where}{_camel(f.name)}"
        if f.name.endswith("_seconds") and not (
            isinstance(value, float | int) and math.isfinite(value) and 0 < value <= MAX_SECONDS
        ):
            problems.append(f"{key} must be more than 0 and at most {MAX_SECONDS:g} seconds, got {value!r}")
        if f.name.endswith("_workers") and not 1 <= value <= MAX_BIND_WORKERS:
            problems.append(f"{key} must be 1 to {MAX_BIND_WORKERS}, got {value!r}")
    return problems


def validate(config: SchedulerConfig) -> None:
    """Raise ConfigError naming the first key whose value the scheduler cannot run with."""
    from kubegpu.allocation import KEY_ID
    from scheduler.core.policies import POLICIES

    lease = config.leader_election
    problems = _problems(config, "") + _problems(lease, "leaderElection.")
    if not DNS_SUBDOMAIN.match(config.scheduler_name) or len(config.scheduler_name) > 253:
        problems.append(f"schedulerName {config.scheduler_name!r} is not a DNS subdomain")
    if not EXTENDED_RESOURCE.match(config.gpu_resource):
        problems.append(f"gpuResource {config.gpu_resource!r} is not a resource name like nvidia.com/gpu")
    if not KEY_ID.fullmatch(config.signing_key_id):
        problems.append(f"signingKeyId {config.signing_key_id!r} is not a key id (letters, digits, _ . -)")
    if config.policy not in POLICIES:
        problems.append(f"policy {config.policy!r} is unknown (known: {', '.join(POLICIES)})")
    if config.metrics_address is not None:
        try:
            split_host_port(config.metrics_address)
        except ValueError as error:
            problems.append(f"metricsAddress {config.metrics_address!r}: {error}")
    if config.extender_address is not None:
        try:
            split_host_port(config.extender_address)
        except ValueError as error:
            problems.append(f"extenderAddress {config.extender_address!r}: {error}")
    if config.extender_advertise_address is not None:
        try:
            host, port = split_host_port(config.extender_advertise_address)
            if host in WILDCARD_HOSTS or port == 0:
                raise ValueError("want the HOST:PORT other replicas reach, not a wildcard or port 0")
        except ValueError as error:
            problems.append(f"extenderAdvertiseAddress {config.extender_advertise_address!r}: {error}")
    if (config.extender_tls_cert_file is None) != (config.extender_tls_private_key_file is None):
        problems.append("extenderTlsCertFile and extenderTlsPrivateKeyFile go together")
    weight = config.utilization_weight
    if not (math.isfinite(weight) and 0 <= weight <= MAX_UTILIZATION_WEIGHT):
        problems.append(f"utilizationWeight must be 0 to {MAX_UTILIZATION_WEIGHT:g}, got {weight!r}")
    if config.backoff_initial_seconds > config.backoff_max_seconds:
        problems.append("backoffInitialSeconds must not exceed backoffMaxSeconds")
    if not LABEL_KEY.match(config.gang_domain_label) or len(config.gang_domain_label) > 316:
        problems.append(f"gangDomainLabel {config.gang_domain_label!r} is not a label key")
    if not config.keys_dir or not config.identity:
        problems.append("keysDir and identity must not be empty")
    if not DNS_SUBDOMAIN.match(lease.namespace) or "." in lease.namespace or len(lease.namespace) > 63:
        problems.append(f"leaderElection.namespace {lease.namespace!r} is not a namespace name")
    if not DNS_SUBDOMAIN.match(lease.lease_name) or len(lease.lease_name) > 253:
        problems.append(f"leaderElection.leaseName {lease.lease_name!r} is not an object name")
    # client-go's rules: leaseDuration > renewDeadline > 1.2 x retryPeriod.
    if not lease.lease_seconds > lease.renew_deadline_seconds > 1.2 * lease.retry_period_seconds:
        problems.append(
            "leaderElection needs leaseSeconds > renewDeadlineSeconds > 1.2 x retryPeriodSeconds"
        )
    if problems:
        raise ConfigError(problems[0])


def load_config(path: str | Path | None) -> SchedulerConfig:
    """Defaults, overlaid with the YAML file at ``path`` (if given)."""
    config = SchedulerConfig()
    if path is None:
        return config
    try:
        doc = yaml.safe_load(read_text(path)) or {}
    except OSError as error:
        raise ConfigError(f"cannot read {path}: {error.strerror or error}") from None
    except (yaml.YAMLError, ValueError) as error:  # ValueError: not UTF-8
        mark = getattr(error, "problem_mark", None)
        at = f" (line {mark.line + 1})" if mark is not None else ""
        problem = getattr(error, "problem", None) or error
        raise ConfigError(f"cannot read {path}: not YAML: {problem}{at}") from None
    if not isinstance(doc, dict):
        raise ConfigError(f"{path}: the top level must be a mapping")
    _apply(config, doc, _CAMEL, str(path))
    return config
