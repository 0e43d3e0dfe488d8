"""The scheduler's configuration file (YAML) and its defaults; see docs/scheduler.md."""

from __future__ import annotations

import socket
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import yaml


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


def load_config(path: str | Path | None) -> SchedulerConfig:
    """Defaults, overlaid with the YAML file at ``path`` (if given)."""
    config = SchedulerConfig()
    if path is None:
        return config
    try:
        doc = yaml.safe_load(Path(path).read_text()) or {}
    except (OSError, yaml.YAMLError) as error:
        raise ConfigError(f"cannot read {path}: {error}") from None
    if not isinstance(doc, dict):
        raise ConfigError(f"{path}: the top level must be a mapping")
    _apply(config, doc, _CAMEL, str(path))
    return config
