"""The RDMA CNI plugin on a node, for ``kubegpu node install --cni-bin-dir`` and ``node check``.

Install writes one file for it: ``<cni bin dir>/kubegpu-cni``, a launcher that execs the
installed ``kubegpu-cni`` console script (a regular file, so the install record's digest, the
atomic write and uninstall's "only if unchanged" rule hold for it as for every other file). It
does not edit the runtime's network config: the conflist belongs to the cluster's network add-on,
which rewrites it; install prints the stanza to chain instead (``chain_stanza``), and ``check``
reads the config the runtime loads (the first file by name in the conf dir, as containerd does)
and says whether it chains the plugin as docs/cni.md shows (``chain_problems``). Pure functions
except ``network_config``, ``chain_status`` and ``plugin_versions``, which read the node.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
from pathlib import Path
from typing import Any

from kubegpu.cni.protocol import DEFAULTS, POD_ANNOTATIONS_CAPABILITY

PLUGIN_TYPE = "kubegpu-cni"
LAUNCHER_NAME = PLUGIN_TYPE  # the runtime finds a plugin by its type, as a file in its bin dir
DEFAULT_CONF_DIR = "/etc/cni/net.d"
DEFAULT_PLUGIN_KEYS_DIR = DEFAULTS["keysDir"]  # kubegpu-cni's keysDir when the stanza has none
POD_ANNOTATIONS = POD_ANNOTATIONS_CAPABILITY
CONFIG_SUFFIXES = (".conf", ".conflist", ".json")  # what libcni (containerd, CRI-O) loads
MAX_CONFIG_BYTES = 1 << 20

LAUNCHER_TEMPLATE = """\
#!/bin/sh
# Written by `kubegpu node install --cni-bin-dir` (docs/cni.md): the runtime runs this as the CNI
# plugin "kubegpu-cni" (network config on stdin, CNI_* in the environment); it runs kubegpu's.
exec '{binary}' "$@"
"""


def launcher_text(binary: str) -> str:
    """The launcher for the plugin executable ``binary`` (an absolute path without quotes)."""
    if not binary.startswith("/") or "'" in binary:
        raise ValueError(f"{binary!r}: an absolute path without quotes")
    return LAUNCHER_TEMPLATE.format(binary=binary)


def chain_stanza(node_name: str | None, keys_dir: str) -> dict[str, Any]:
    """The plugin's entry in the pod network's conflist, for this node."""
    stanza: dict[str, Any] = {"type": PLUGIN_TYPE, "capabilities": {POD_ANNOTATIONS: True}}
    if node_name:
        stanza["nodeName"] = node_name
    stanza["keysDir"] = keys_dir
    return stanza


def network_config(conf_dir: Path) -> tuple[Path | None, dict[str, Any] | str]:
    """(the file the runtime loads, its JSON object) from ``conf_dir``: the first regular file by
    name with a CNI config suffix; (None, why) when there is none, (path, why) when unreadable."""
    try:
        names = sorted(p.name for p in conf_dir.iterdir() if p.suffix in CONFIG_SUFFIXES and p.is_file())
    except OSError as exc:
        return None, str(exc.strerror or exc)
    if not names:
        return None, f"no network config ({', '.join('*' + x for x in CONFIG_SUFFIXES)})"
    path = conf_dir / names[0]
    try:
        with path.open("rb") as handle:
            data = handle.read(MAX_CONFIG_BYTES + 1)
        if len(data) > MAX_CONFIG_BYTES:
            return path, f"more than {MAX_CONFIG_BYTES} bytes"
        doc = json.loads(data)
    except (OSError, ValueError, RecursionError) as exc:
        return path, f"unreadable ({exc})"
    if not isinstance(doc, dict):
        return path, "not a JSON object"
    return path, doc


def chain_problems(doc: dict[str, Any], node_name: str | None, keys_dir: str, hostname: str) -> list[str]:
    """Why a network config does not give pods kubegpu-cni as docs/cni.md shows (empty: it does):
    a conflist whose plugins hold one entry of type kubegpu-cni, after the primary network's,
    asking for the pod annotations, with this install's keys directory and node name (the shim's
    ``node_name``, or ``hostname`` in lowercase as both take without one; a stanza without
    ``nodeName`` has the plugin take the hostname too)."""
    plugins = doc.get("plugins")
    if not isinstance(plugins, list):
        return [f"a single-plugin config ({doc.get('type', '?')}), not a conflist: nothing is chained"]
    types = [p.get("type") if isinstance(p, dict) else None for p in plugins]
    if PLUGIN_TYPE not in types:
        return [f"its plugins ({', '.join(map(str, types)) or 'none'}) do not chain {PLUGIN_TYPE}"]
    if types.count(PLUGIN_TYPE) > 1:
        return [f"{PLUGIN_TYPE} is chained {types.count(PLUGIN_TYPE)} times"]
    index = types.index(PLUGIN_TYPE)
    ours: dict[str, Any] = plugins[index]
    problems = []
    if index == 0:
        problems.append(f"{PLUGIN_TYPE} is first: chain it after the plugins that make the primary network")
    capabilities = ours.get("capabilities")
    if not (isinstance(capabilities, dict) and capabilities.get(POD_ANNOTATIONS) is True):
        problems.append(f'it lacks "capabilities": {{"{POD_ANNOTATIONS}": true}}')
    plugin_keys = ours.get("keysDir", DEFAULT_PLUGIN_KEYS_DIR)
    if plugin_keys != keys_dir:
        problems.append(f"its keysDir is {plugin_keys}, the shim's keys are in {keys_dir}")
    node, plugin_node = node_name or hostname.lower(), ours.get("nodeName")
    if plugin_node is not None and plugin_node != node:
        problems.append(f"its nodeName is {plugin_node}, this node is {node}")
    elif plugin_node is None and hostname.lower() != node:
        problems.append(
            f"it names no nodeName, so the plugin takes the hostname {hostname.lower()}, this node is {node}"
            " (give the stanza its nodeName)"
        )
    return problems


def chain_status(root: Path, conf_dir: str, node_name: str | None, keys_dir: str) -> tuple[str, list[str]]:
    """(the config the runtime loads from ``conf_dir`` under ``root``, as the node names it, or the
    directory when there is none; why it does not chain the plugin as it should: empty when it does)."""
    conf, doc = network_config(root / conf_dir.lstrip("/"))
    where = "/" + str(conf.relative_to(root)) if conf is not None else conf_dir
    if isinstance(doc, str):
        return where, [doc]
    return where, chain_problems(doc, node_name, keys_dir, socket.gethostname())


def plugin_versions(executable: Path, timeout: float = 30.0) -> list[str] | str:
    """The CNI versions ``executable`` answers to VERSION with, or why it does not."""
    if not (executable.is_file() and os.access(executable, os.X_OK)):
        return f"{executable} is not an executable file"
    env = {"CNI_COMMAND": "VERSION", "PATH": os.environ.get("PATH", os.defpath)}
    try:
        result = subprocess.run(
            [str(executable)], input=b'{"cniVersion": "1.0.0"}', env=env, capture_output=True, timeout=timeout
        )
    except subprocess.TimeoutExpired:
        return f"{executable} gave no VERSION answer within {timeout:g}s"
    except OSError as exc:
        return f"{executable}: {exc.strerror or exc}"
    try:
        versions = json.loads(result.stdout)["supportedVersions"]
    except (ValueError, KeyError, TypeError, RecursionError):
        versions = None
    if result.returncode != 0 or not isinstance(versions, list):
        answer = (result.stdout or result.stderr)[-200:]
        return f"{executable} VERSION exited {result.returncode}: {answer!r}"
    return [str(v) for v in versions]
