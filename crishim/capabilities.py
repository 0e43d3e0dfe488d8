"""Whether a CreateContainer gives the container CAP_SYS_ADMIN, read as containerd reads it.

With CAP_SYS_ADMIN a container that is not privileged can still lift its device cgroup (on
cgroup v1: mount the devices hierarchy writable and add ``c 195:* rwm`` to its own
``devices.allow``) and then open any GPU node it makes with mknod, past the shim's scrub. The
shim refuses such a container on a device node unless its namespace is allowed
(docs/crishim.md, "Privileged and CAP_SYS_ADMIN containers").

containerd 2.x (``internal/cri/opts/spec_opts.go``, ``WithCapabilities``) applies, in order:
``ALL`` in ``add_capabilities`` (compared case-insensitively) grants every capability; ``ALL``
in ``drop_capabilities`` then removes every one; each other added name, upper-cased with
``CAP_`` put in front, is added; each other dropped name likewise is removed. The decision here
errs towards "granted": an added name counts with or without its own ``CAP_`` prefix (another
runtime, or a later containerd, may strip it) and under Python's and Go's upper-casing (which
differ for a few letters), and so does a name in ``add_ambient_capabilities`` (containerd
ignores them, another runtime may not), while a drop counts only when spelled as containerd
drops it.
"""

from __future__ import annotations

from collections.abc import Iterable

from crishim.cri import api_pb2

SYS_ADMIN = "SYS_ADMIN"
ALL = "ALL"


def _go_upper(name: str) -> str:
    """Go's ``strings.ToUpper``: each letter's simple upper case (one letter for one letter)."""
    return "".join(upper if len(upper := char.upper()) == 1 else char for char in name)


def _spellings(name: str) -> set[str]:
    """What an added capability name may mean: upper-cased either way, with or without ``CAP_``."""
    forms = {name.upper(), _go_upper(name)}
    return forms | {form.removeprefix("CAP_") for form in forms}


def _is_all(name: str) -> bool:
    """containerd's ``ALL``: ``strings.EqualFold`` (and ``ToUpper``) with ``"ALL"``."""
    return name.casefold() == "all" or ALL in {name.upper(), _go_upper(name)}


def sys_admin_grant(capabilities: api_pb2.Capability) -> str | None:
    """The added name that gives the container CAP_SYS_ADMIN (as the request spells it), or None
    when it does not get it."""
    # containerd 2.x ignores ambient capabilities; a runtime that honours them grants them too
    added: Iterable[str] = [*capabilities.add_capabilities, *capabilities.add_ambient_capabilities]
    dropped: Iterable[str] = capabilities.drop_capabilities
    if any(_go_upper(name) == SYS_ADMIN for name in dropped):
        return None  # dropped last, whatever was added
    for name in added:
        if not _is_all(name) and SYS_ADMIN in _spellings(name):
            return name
    if any(_is_all(name) for name in dropped):
        return None  # ALL dropped after ALL added: only the names added one by one count
    return next((name for name in added if _is_all(name)), None)
