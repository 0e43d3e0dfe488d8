"""Canonical paths, and the device nodes a CRI device entry reaches on this host.

The scrub (``crishim.edits``) must decide on what containerd and the NVIDIA toolkit will do,
not on how a path happens to be spelled. They resolve spellings: containerd follows a device
entry's host path through symlinks (``/dev/char/195:0`` is one) and the kernel resolves ``/./``,
``//`` and ``..``; a host path that is a directory gives the container every device node below
it; the toolkit cleans mount paths (Go's ``filepath.Clean``) before it prefix-matches them.

``ManagedDevices`` is what the node's plugins own: device numbers (exact, and whole majors) and
canonical path patterns (for nodes that do not exist yet, e.g. before the driver is loaded).
``device_entry_verdict`` says what to do with one device entry: keep it, drop it (it reaches a
managed device node), or refuse the container (``Ambiguous``: the shim cannot tell what it
would reach). Resolution goes through ``HostFS`` so tests can count or fake the calls.
"""

from __future__ import annotations

import fnmatch
import os
import re
import stat
from collections.abc import Iterable
from dataclasses import dataclass, field

CHAR, BLOCK = "c", "b"
# /dev/char/M:m and /dev/block/M:m name a device by its numbers (udev keeps them as symlinks).
_NUMBERED = re.compile(r"^/dev/(char|block)/(\d{1,10}):(\d{1,10})$")
# A directory entry is walked at most this deep and this wide; beyond that the shim refuses.
MAX_WALK_ENTRIES = 20000
MAX_WALK_DEPTH = 16


class Ambiguous(Exception):
    """The shim cannot tell what an entry would give the container; the container is refused."""


def _named(path: str) -> str:
    """A path as messages quote it: at most 200 characters (a refusal must stay small)."""
    return repr(path) if len(path) <= 200 else repr(path[:200]) + f"... ({len(path)} characters)"


def clean(path: str) -> str:
    """Go's ``filepath.Clean`` for absolute paths: one slash, no ``.``, ``..`` resolved lexically."""
    parts: list[str] = []
    for part in path.split("/"):
        if part in ("", "."):
            continue
        if part == "..":
            if parts:
                parts.pop()
            continue
        parts.append(part)
    return "/" + "/".join(parts)


@dataclass(frozen=True)
class DeviceNumber:
    kind: str  # CHAR or BLOCK
    major: int
    minor: int

    def __str__(self) -> str:
        return f"{self.kind} {self.major}:{self.minor}"


@dataclass(frozen=True)
class Reached:
    """A device node that a device entry would put into the container."""

    path: str
    number: DeviceNumber


_WILDCARD = re.compile(r"[*?\[]")  # what makes an fnmatch pattern more than one path


@dataclass(frozen=True)
class ManagedDevices:
    """The device nodes the node's plugins own, however a request spells them."""

    numbers: frozenset[DeviceNumber] = frozenset()
    char_majors: frozenset[int] = frozenset()  # every char device of these majors
    patterns: tuple[str, ...] = ()  # fnmatch patterns of canonical host paths
    _compiled: tuple[re.Pattern[str], ...] = field(default=(), compare=False, repr=False)
    _exact: frozenset[str] = field(default=frozenset(), compare=False, repr=False)

    def __post_init__(self) -> None:
        # most patterns are one node's path (glob.escape'd, no wildcard): a set lookup, not a
        # regex each; the create path asks has_path of every mount source
        literal = {p for p in self.patterns if not _WILDCARD.search(p)}
        object.__setattr__(self, "_exact", frozenset(literal))
        wild = tuple(re.compile(fnmatch.translate(p)) for p in self.patterns if p not in literal)
        object.__setattr__(self, "_compiled", wild)

    def has_number(self, number: DeviceNumber) -> bool:
        return number in self.numbers or (number.kind == CHAR and number.major in self.char_majors)

    def has_path(self, canonical: str) -> bool:
        return canonical in self._exact or any(p.match(canonical) for p in self._compiled)

    def is_empty(self) -> bool:
        return not (self.numbers or self.char_majors or self.patterns)


class HostFS:
    """The host's filesystem as containerd sees it (a seam for tests)."""

    def stat(self, path: str) -> os.stat_result:
        return os.stat(path)

    def realpath(self, path: str) -> str:
        return os.path.realpath(path)

    def scandir(self, path: str) -> Iterable[os.DirEntry[str]]:
        with os.scandir(path) as entries:
            return list(entries)


def number_of(st: os.stat_result) -> DeviceNumber | None:
    if stat.S_ISCHR(st.st_mode):
        return DeviceNumber(CHAR, os.major(st.st_rdev), os.minor(st.st_rdev))
    if stat.S_ISBLK(st.st_mode):
        return DeviceNumber(BLOCK, os.major(st.st_rdev), os.minor(st.st_rdev))
    return None


def numbers_of(paths: Iterable[str], fs: HostFS | None = None) -> frozenset[DeviceNumber]:
    """The device numbers of those ``paths`` that exist and are device nodes (following symlinks)."""
    fs = fs or HostFS()
    found = set()
    for path in paths:
        try:
            number = number_of(fs.stat(path))
        except OSError:
            continue
        if number is not None:
            found.add(number)
    return frozenset(found)


def reached_devices(path: str, fs: HostFS | None = None) -> tuple[bool, list[Reached]]:
    """(is a directory, the device nodes) a device entry with host ``path`` gives a container.

    As containerd does it: the path is followed through symlinks; a device node is itself; a
    directory gives every device node below it (entries are not followed through symlinks).
    Raises OSError when the path cannot be resolved, Ambiguous when a directory is too large or
    changes while it is walked.
    """
    fs = fs or HostFS()
    top = fs.stat(path)
    number = number_of(top)
    if not stat.S_ISDIR(top.st_mode):
        return False, [Reached(path, number)] if number is not None else []
    found: list[Reached] = []
    pending = [(path, 0)]
    seen = 0
    while pending:
        directory, depth = pending.pop()
        try:
            entries = fs.scandir(directory)
        except OSError as error:  # listed a moment ago: the directory is changing under us
            changed = f"directory {_named(path)} changed while it was checked"
            raise Ambiguous(f"{changed}: {error.strerror}") from None
        for entry in entries:
            seen += 1
            if seen > MAX_WALK_ENTRIES or depth > MAX_WALK_DEPTH:
                raise Ambiguous(f"directory {_named(path)} is too large to check")
            if entry.is_dir(follow_symlinks=False):
                pending.append((entry.path, depth + 1))
                continue
            try:
                number = number_of(entry.stat(follow_symlinks=False))
            except OSError:
                continue
            if number is not None:
                found.append(Reached(entry.path, number))
    return True, found


def device_entry_verdict(host_path: str, managed: ManagedDevices, fs: HostFS | None = None) -> bool:
    """True: keep the device entry; False: drop it (it reaches a managed device node).

    Raises Ambiguous when the shim cannot tell what the entry reaches (a relative path, a path
    that cannot be resolved, a directory holding managed device nodes).
    """
    if not host_path.startswith("/") or "\x00" in host_path:
        raise Ambiguous(f"device host path {host_path[:200]!r} is not an absolute path")
    canonical = clean(host_path)
    numbered = _NUMBERED.match(canonical)
    if numbered is not None:
        kind = CHAR if numbered.group(1) == "char" else BLOCK
        if managed.has_number(DeviceNumber(kind, int(numbered.group(2)), int(numbered.group(3)))):
            return False
    if managed.has_path(canonical):
        return False
    fs = fs or HostFS()
    # ``..`` after a symlink goes up from the link's target (the kernel, Go's EvalSymlinks), so the
    # raw spelling is resolved as it stands; the lexically cleaned one too, to be safe both ways.
    try:
        resolutions = (fs.realpath(host_path), fs.realpath(canonical))
    except OSError as error:  # a symlink on the way that cannot be read (readlink refused)
        unresolved = f"device host path {_named(host_path)} cannot be resolved"
        raise Ambiguous(f"{unresolved}: {error.strerror}") from None
    for resolved in dict.fromkeys(resolutions):
        if not _resolved_verdict(host_path, resolved, managed, fs):
            return False
    return True


def _resolved_verdict(host_path: str, resolved: str, managed: ManagedDevices, fs: HostFS) -> bool:
    """``device_entry_verdict`` for one resolution of ``host_path``."""
    if managed.has_path(resolved):
        return False
    try:
        is_dir, reached = reached_devices(resolved, fs)
    except FileNotFoundError:
        return True  # containerd cannot create it either: the create fails there
    except OSError as error:
        unresolved = f"device host path {_named(host_path)} cannot be resolved"
        raise Ambiguous(f"{unresolved}: {error.strerror}") from None
    hits = [r for r in reached if managed.has_number(r.number) or managed.has_path(r.path)]
    if not hits:
        return True
    if is_dir:
        raise Ambiguous(
            f"device host path {_named(host_path)} is a directory holding managed device nodes "
            f"({_named(hits[0].path)}, {hits[0].number})"
        )
    return False
