"""The plugin registry: builds the device plugins by name from one options mapping, so the command
line, the advertiser and the shim configure them the same way.

It sits above the plugins (``devices.nvidia``, ``devices.sim``, ``devices.rdma``) and the interface
they implement (``devices.plugin``). Each plugin module is imported when it is first built, so a
node without ``pynvml`` loads the others.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from devices.plugin import DevicePlugin, PluginConfigError

PluginFactory = Callable[[Mapping[str, Any]], DevicePlugin]


def _nvidia(options: Mapping[str, Any]) -> DevicePlugin:
    from devices.nvidia import NvidiaPlugin

    return NvidiaPlugin.from_options(options)


def _sim(options: Mapping[str, Any]) -> DevicePlugin:
    from devices.sim import SimPlugin

    return SimPlugin.from_options(options)


def _rdma(options: Mapping[str, Any]) -> DevicePlugin:
    from devices.rdma import RdmaPlugin

    return RdmaPlugin.from_options(options)


_REGISTRY: dict[str, PluginFactory] = {"nvidia": _nvidia, "sim": _sim, "rdma": _rdma}


def register_plugin(name: str, factory: PluginFactory) -> None:
    """Make ``name`` loadable by ``load_plugins`` (for out-of-tree plugins and tests)."""
    _REGISTRY[name] = factory


def plugin_names() -> list[str]:
    return sorted(_REGISTRY)


def load_plugins(names: Iterable[str], options: Mapping[str, Any] | None = None) -> list[DevicePlugin]:
    """Build the named plugins, in order, from one options mapping.

    Options (each plugin reads the ones it needs): ``topology`` (sim: topology file),
    ``node_name`` (sim), ``state_dir`` (sim), ``sysfs_root`` (rdma, nvidia NUMA fallback and
    NIC affinity; default ``/``), ``cdi`` (nvidia: also name CDI devices), ``nvml`` (nvidia: a
    module object standing in for ``pynvml``).
    """
    options = options or {}
    names = list(names)
    plugins: list[DevicePlugin] = []
    for name in names:
        factory = _REGISTRY.get(name)
        if factory is None:
            raise PluginConfigError(f"unknown device plugin {name!r} (known: {', '.join(plugin_names())})")
        plugins.append(factory(options))
    if len({p.name for p in plugins}) != len(plugins):
        raise PluginConfigError(f"device plugin listed twice: {', '.join(names)}")
    return plugins
