"""containerd 2.x's NRI settings as containerd reads them, and the drop-in that makes it require kubegpu.

containerd loads its config file, then every file its ``imports`` name (a pattern with ``*`` is a
glob, sorted; a relative one is taken from the importing file's directory; imported files may
import more), each merged over what came before: tables key by key, any other value (a list, a
false, an empty string) replaced outright; top-level ``disabled_plugins`` appended
(cmd/containerd/server/config/config.go, ``LoadConfig`` and ``mergeConfig``, v2.2.9). So a
drop-in can switch NRI on, pin its socket and require a plugin, but it cannot take a plugin out
of ``disabled_plugins``, and a list it sets replaces the admin's. ``read_containerd_config``
follows those rules under a root, remembering which file set each NRI value, and ``plan_dropin``
decides from them what kubegpu's drop-in must say, or why it cannot say it (docs/install.md).

Every path here is a path as the node sees it (absolute, under ``/``); files are read under ``root``.
"""

from __future__ import annotations

import copy
import fnmatch
import json
import posixpath
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

NRI_PLUGIN = "io.containerd.nri.v1.nri"
DEFAULT_CONFIG = "/etc/containerd/config.toml"
DEFAULT_NRI_SOCKET = "/var/run/nri/nri.sock"  # containerd's default socket_path
# containerd 2.x's own default (what `containerd config default` writes), suggested when there is none
SUGGESTED_IMPORT = "/etc/containerd/conf.d/*.toml"
# Names tried, in order, for kubegpu's drop-in in an imported directory: the first the glob takes.
DROPIN_NAMES = ("99-kubegpu-nri.toml", "99-kubegpu-nri.conf", "99-kubegpu-nri")
MAX_FILES = 64  # more imported files than this: a loop of patterns, or not a config at all
GLOB_CHARS = "*?["


class ConfigError(Exception):
    """containerd's config cannot be read, or says what kubegpu must not override. The message says
    which file and what to do."""


@dataclass
class ContainerdConfig:
    """The merged view of the parts kubegpu's NRI front relies on."""

    main: str
    files: list[str] = field(default_factory=list)  # in load order
    version: int = 0
    imports: list[str] = field(default_factory=list)  # the main file's own, as written
    disabled_by: list[str] = field(default_factory=list)  # files whose disabled_plugins list NRI
    nri: dict[str, Any] = field(default_factory=dict)  # the merged NRI table
    origin: dict[str, str] = field(default_factory=dict)  # "default_validator.enable" -> file that set it

    def value(self, key: str, default: Any) -> Any:
        table: Any = self.nri
        for part in key.split("."):
            if not isinstance(table, dict) or part not in table:
                return default
            table = table[part]
        return table

    def where(self, key: str) -> str:
        """Which file set ``key`` last ("containerd's default" when none did)."""
        return self.origin.get(key, "containerd's default")

    @property
    def socket(self) -> str:
        return str(self.value("socket_path", "") or DEFAULT_NRI_SOCKET)

    @property
    def nri_enabled(self) -> bool:
        return not self.disabled_by and not self.value("disable", False)

    @property
    def connections_allowed(self) -> bool:
        return not self.value("disable_connections", False)

    @property
    def validator_enabled(self) -> bool:
        return bool(self.value("default_validator.enable", False))

    @property
    def required(self) -> tuple[str, ...]:
        return tuple(self.value("default_validator.required_plugins", []))

    @property
    def tolerate_annotation(self) -> str:
        return str(self.value("default_validator.tolerate_missing_plugins_annotation", ""))

    def requires(self, plugin: str) -> bool:
        """containerd creates no container while ``plugin`` is not connected (fail closed)."""
        return (
            self.nri_enabled
            and self.connections_allowed
            and self.validator_enabled
            and plugin in self.required
            and not self.tolerate_annotation
        )


# The NRI keys kubegpu reads, with the type containerd decodes them into.
TYPES: dict[str, type | tuple[type, ...]] = {
    "disable": bool,
    "disable_connections": bool,
    "socket_path": str,
    "default_validator.enable": bool,
    "default_validator.required_plugins": list,
    "default_validator.tolerate_missing_plugins_annotation": str,
}


def under(root: Path, path: str) -> Path:
    return root / path.lstrip("/")


def resolve_import(importer: str, pattern: str) -> str:
    """An import as containerd resolves it: cleaned, a relative one from the importer's directory."""
    path = posixpath.normpath(pattern)
    if not path.startswith("/"):
        path = posixpath.normpath(posixpath.join(posixpath.dirname(importer), path))
    return path


def _exists(root: Path, path: str, overlay: Mapping[str, bytes | None]) -> bool:
    if path in overlay:
        return overlay[path] is not None
    return under(root, path).is_file()


def expand(root: Path, importer: str, pattern: str, overlay: Mapping[str, bytes | None]) -> list[str]:
    """The files an import names, in containerd's order (a glob's matches sorted bytewise)."""
    path = resolve_import(importer, pattern)
    if "*" not in path:
        if not _exists(root, path, overlay):
            raise ConfigError(f"{importer} imports {path}, which does not exist (containerd would not start)")
        return [path]
    directory, name = posixpath.split(path)
    if any(c in directory for c in GLOB_CHARS):
        raise ConfigError(
            f"{importer} imports {pattern}: kubegpu cannot follow a pattern in a directory name"
        )
    try:
        names = {p.name for p in under(root, directory).iterdir() if p.is_file()}
    except OSError:
        names = set()
    for planned, data in overlay.items():
        if posixpath.dirname(planned) == directory:
            (names.add if data is not None else names.discard)(posixpath.basename(planned))
    matches = [n for n in names if fnmatch.fnmatchcase(n, name) and not n.startswith(".kubegpu-")]
    return [posixpath.join(directory, n) for n in sorted(matches, key=lambda n: n.encode())]


def _read(root: Path, path: str, overlay: Mapping[str, bytes | None]) -> dict[str, Any]:
    try:
        data = overlay[path] if path in overlay else under(root, path).read_bytes()
        assert data is not None
        return tomllib.loads(data.decode())
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror}") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path} is not valid TOML ({exc}); containerd would not start with it") from None


def _merge(
    into: dict[str, Any], table: dict[str, Any], origin: dict[str, str], path: str, prefix: str = ""
) -> None:
    """mergeConfig's rule for plugin tables: tables merged key by key, anything else replaced."""
    for key, value in table.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, dict):
            if not isinstance(into.get(key), dict):
                into[key] = {}
            _merge(into[key], value, origin, path, dotted + ".")
        else:
            into[key] = copy.deepcopy(value)
            origin[dotted] = path


def read_containerd_config(
    root: Path, config: str | Path = DEFAULT_CONFIG, overlay: Mapping[str, bytes | None] | None = None
) -> ContainerdConfig:
    """containerd's config at ``config`` (a node path) and its imports, read under ``root`` and
    merged as containerd merges them. ``overlay`` stands in for files (node path -> bytes, or None
    for a file taken as absent): the drop-in install plans, or its own current one left out."""
    overlay = overlay or {}
    main = str(config)
    if not _exists(root, main, overlay):
        raise ConfigError(f"no containerd config at {main}")
    view = ContainerdConfig(main)
    pending, loaded = [main], set()
    while pending:
        path, pending = pending[0], pending[1:]
        if path in loaded:
            continue
        if len(loaded) >= MAX_FILES:
            raise ConfigError(f"{main} imports more than {MAX_FILES} files")
        doc = _read(root, path, overlay)
        version = doc.get("version", 0)
        if not isinstance(version, int) or version < 2:
            raise ConfigError(
                f"{path} has config version {version or 1} (containerd 1.x's layout, which 2.x migrates "
                "when it loads it): kubegpu writes only version 2 or 3 drop-ins; migrate it first "
                "(containerd config migrate)"
            )
        view.version = version
        disabled = doc.get("disabled_plugins", [])
        if isinstance(disabled, list) and NRI_PLUGIN in disabled:
            view.disabled_by.append(path)
        plugins = doc.get("plugins", {})
        table = plugins.get(NRI_PLUGIN, {}) if isinstance(plugins, dict) else {}
        if not isinstance(table, dict):
            raise ConfigError(f"{path}: plugins.{NRI_PLUGIN!r} is not a table")
        _merge(view.nri, table, view.origin, path)
        imports = doc.get("imports", [])
        if not isinstance(imports, list) or not all(isinstance(i, str) for i in imports):
            raise ConfigError(f"{path}: imports is not a list of paths")
        if path == main:
            view.imports = list(imports)
        loaded.add(path)
        view.files.append(path)
        for pattern in imports:
            pending += expand(root, path, pattern, overlay)
    for key, kind in TYPES.items():
        value = view.value(key, None)
        if value is not None and not isinstance(value, kind):
            raise ConfigError(
                f"{view.where(key)} sets NRI's {key} to {value!r}, which containerd cannot read"
            )
    return view


# ---------------------------------------------------------------------------- kubegpu's drop-in


def dropin_path(root: Path, view: ContainerdConfig) -> str:
    """Where kubegpu's drop-in goes: the first of the main config's glob imports whose directory
    is a plain one inside ``root`` and whose pattern takes one of DROPIN_NAMES; ConfigError if none."""
    real_root = Path(root).resolve()
    for pattern in view.imports:
        path = resolve_import(view.main, pattern)
        directory, name = posixpath.split(path)
        if "*" not in name or any(c in directory for c in GLOB_CHARS):
            continue
        if not Path(under(root, directory)).resolve().is_relative_to(real_root):
            continue
        for candidate in DROPIN_NAMES:
            if fnmatch.fnmatchcase(candidate, name):
                return posixpath.join(directory, candidate)
    raise ConfigError(
        f"{view.main} imports no drop-in directory: add imports = [{json.dumps(SUGGESTED_IMPORT)}] "
        "at its top (containerd 2.x's own default; kubegpu then writes its NRI settings in a file "
        "there and never edits config.toml), restart containerd, and run install again"
    )


def conflicts(view: ContainerdConfig, plugin: str) -> list[str]:
    """The admin's settings a drop-in must not override (empty: none)."""
    problems = []
    if view.disabled_by:
        problems.append(
            f"disabled_plugins lists {NRI_PLUGIN} in {', '.join(view.disabled_by)} (a drop-in cannot "
            "take it out of that list): remove it there"
        )
    if not view.connections_allowed:
        problems.append(
            f"NRI's disable_connections = true in {view.where('disable_connections')} keeps external "
            "plugins such as kubegpu's agent out: set it false there"
        )
    if view.tolerate_annotation:
        problems.append(
            f"NRI's default_validator sets tolerate_missing_plugins_annotation = "
            f"{json.dumps(view.tolerate_annotation)} in "
            f"{view.where('default_validator.tolerate_missing_plugins_annotation')}: a pod with that "
            "annotation would be created while the agent is away; remove the setting there"
        )
    if view.required and plugin not in view.required:
        problems.append(
            f"NRI's default_validator.required_plugins = {json.dumps(list(view.required))} in "
            f"{view.where('default_validator.required_plugins')} (containerd replaces a list from a "
            f"drop-in, so kubegpu's cannot add to it): add {json.dumps(plugin)} to required_plugins there"
        )
    return problems


def needed(view: ContainerdConfig, plugin: str) -> dict[str, Any]:
    """The NRI values the drop-in must set ("default_validator.enable" -> True ...); empty when
    containerd already requires ``plugin``."""
    want: dict[str, Any] = {}
    if view.value("disable", False):
        want["disable"] = False
    if not view.validator_enabled:
        want["default_validator.enable"] = True
    if plugin not in view.required:
        want["default_validator.required_plugins"] = [plugin]
    return want


def dropin_text(version: int, socket: str, values: Mapping[str, Any]) -> str:
    """kubegpu's drop-in: ``values`` and the socket the agent uses, in the main config's version
    (a version 3 drop-in over a version 2 config would make containerd skip migrating the admin's
    version 2 tables, e.g. the CRI plugin's)."""
    main = {k: v for k, v in values.items() if "." not in k}
    validator = {k.split(".", 1)[1]: v for k, v in values.items() if k.startswith("default_validator.")}
    lines = [
        "# Written by `kubegpu node install --front nri` (docs/install.md): containerd calls kubegpu's",
        "# node agent as an NRI plugin and creates no container while it is away (docs/nri.md).",
        "# `kubegpu node uninstall` removes this file; restart containerd after either.",
        f"version = {version}",
        "",
        f'[plugins."{NRI_PLUGIN}"]',
    ]
    lines += [f"  {key} = {json.dumps(value)}" for key, value in main.items()]
    lines.append(f"  socket_path = {json.dumps(socket)}")
    if validator:
        lines += ["", f'[plugins."{NRI_PLUGIN}".default_validator]']
        lines += [f"  {key} = {json.dumps(value)}" for key, value in validator.items()]
    return "\n".join(lines) + "\n"


@dataclass(frozen=True)
class NriPlan:
    """What install does to containerd: the drop-in (path and text, or None: nothing to write)
    and the socket the agent connects to."""

    path: str | None
    text: str | None
    socket: str
    view: ContainerdConfig


def plan_dropin(root: Path, config: str, plugin: str, ours: tuple[str, ...] = ()) -> NriPlan:
    """Decide kubegpu's containerd drop-in (ConfigError with what to do where it cannot be written).
    ``ours``: drop-ins an earlier install wrote, left out of the reading (they are rewritten or removed)."""
    view = read_containerd_config(root, config, {path: None for path in ours})
    problems = conflicts(view, plugin)
    if problems:
        raise ConfigError("; ".join(problems))
    want = needed(view, plugin)
    if not want:
        return NriPlan(None, None, view.socket, view)
    path = dropin_path(root, view)
    text = dropin_text(view.version, view.socket, want)
    overlay: dict[str, bytes | None] = {p: None for p in ours}
    overlay[path] = text.encode()
    merged = read_containerd_config(root, config, overlay)
    if not merged.requires(plugin) or merged.socket != view.socket:
        later = sorted(
            {
                merged.where(key)
                for key in ("disable", "socket_path", *(k for k in TYPES if k.startswith("default_")))
                if merged.where(key) not in (path, "containerd's default")
                and merged.files.index(merged.where(key)) > merged.files.index(path)
            }
        )
        raise ConfigError(
            f"{', '.join(later) or 'another file'} is merged after {path} and overrides the NRI "
            "settings kubegpu would write there: move those settings into the main config or remove them"
        )
    return NriPlan(path, text, view.socket, view)
