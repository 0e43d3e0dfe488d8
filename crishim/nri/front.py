"""The NRI front's translation: an NRI container into the rewrite core's terms, and the core's
changed ``ContainerSpec`` back into the ``ContainerAdjustment`` containerd applies.

containerd shows an NRI plugin the container as its OCI spec will be (issue #22): environment
as ``NAME=value`` strings, mounts by destination, and device nodes as OCI devices, made from
their type and numbers whatever their path (CDI devices already injected). So a device entry is
judged by its number (``DeviceEntry.number``), and a device the plugins add is given the type and
numbers of its host node (``number_of``, a ``stat`` of the host path on the node).

An adjustment can only add and remove: a removal is the name (annotation) or path (mount
destination, device path) with a leading ``-``; containerd applies removals before additions.
``adjustment`` therefore diffs the spec as the core left it against the container as it came.
Environment and devices are the exceptions: NRI v0.11 (containerd 2.2.9) passes a removed
variable or device on to later plugins but never removes it from the OCI spec (mounts it does
remove). So a variable the scrub takes out is set to the empty string instead
(``KUBEGPU_VISIBLE_DEVICES=``), which selects nothing, and a device it takes out is also denied in
the container's device cgroup (``c 195:0 rwm``, after the allow rule containerd made): the node
may stay in ``/dev``, but it cannot be opened, read or written. runc's default devices (``/dev/null``
and the like) are never denied; only the sim plugin's stand-in nodes share their numbers.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

from crishim import edits
from crishim.container import ContainerSpec, DeviceEntry, MountEntry
from crishim.hostpaths import BLOCK, CHAR, Ambiguous, DeviceNumber, ManagedDevices
from crishim.nri import api_pb2

REMOVE = "-"
# Devices runc gives every container (null, zero, full, random, urandom, tty, ptmx): never denied
RUNC_DEFAULTS = frozenset({(1, 3), (1, 5), (1, 7), (1, 8), (1, 9), (5, 0), (5, 2)})
BIND_OPTIONS = ("rbind", "rprivate")
# OCI device types: c and u are character devices, b block, p a FIFO (reaches no device)
DEVICE_KINDS = {"c": CHAR, "u": CHAR, "b": BLOCK}


def _env(entries: list[str]) -> list[tuple[str, bytes]]:
    env = []
    for entry in entries:
        key, equals, value = entry.partition("=")
        if not equals:
            raise Ambiguous(f"environment entry {entry[:200]!r} has no '='")
        env.append((key, value.encode("utf-8", "surrogateescape")))
    return env


def _device(device: api_pb2.LinuxDevice) -> DeviceEntry:
    kind = DEVICE_KINDS.get(device.type)
    number = DeviceNumber(kind, device.major, device.minor) if kind is not None else None
    if kind is None and device.type != "p":
        raise Ambiguous(f"device {device.path[:200]!r} has an unknown type {device.type[:20]!r}")
    return DeviceEntry(
        device.path, "", origin=device, number=number or DeviceNumber("p", device.major, device.minor)
    )


def spec_from_nri(container: api_pb2.Container) -> ContainerSpec:
    """The container as the rewrite core reads it. Raises Ambiguous for an entry it cannot read."""
    return ContainerSpec(
        env=_env(list(container.env)),
        devices=[_device(d) for d in container.linux.devices],
        mounts=[
            MountEntry(m.destination, m.source, "ro" in m.options, origin=m) for m in container.mounts
        ],
        cdi_devices=[c.name for c in container.CDI_devices],
        annotations=dict(container.annotations),
    )


def _deniable(number: DeviceNumber | None) -> bool:
    """Whether a scrubbed device's number can be denied in the device cgroup (not runc's own)."""
    if number is None or number.kind not in (CHAR, BLOCK):
        return False
    return (number.major, number.minor) not in RUNC_DEFAULTS


def _last_values(env: list[tuple[str, bytes]]) -> dict[str, bytes]:
    values: dict[str, bytes] = {}
    for key, value in env:
        values[key] = value
    return values


def _env_changes(before: ContainerSpec, after: ContainerSpec) -> list[tuple[str, bytes]]:
    """The variables containerd must set to make ``before``'s environment into ``after``'s: each
    whose last value changed, and each the core took out (emptied: NRI v0.11 drops env removals
    on the way to the OCI spec).

    NRI v0.11 sets a plugin's value on the first entry of a variable the spec holds more than once
    (the image's and the pod's: containerd appends both) and then lets each later entry overwrite
    it with its own value, so the last original value wins. A variable set more than once that
    must change is therefore refused (``Ambiguous``): kubegpu could not give it its value (an MPS
    client's limits, a selector it neutralises)."""
    old, new = _last_values(before.env), _last_values(after.env)
    changes = [(key, b"") for key in old if key not in new]
    changes += [(key, value) for key, value in new.items() if old.get(key) != value]
    counts = Counter(key for key, _ in before.env)
    repeated = sorted(key for key, _ in changes if counts[key] > 1)
    if repeated:
        key = repeated[0]
        raise Ambiguous(
            f"environment variable {key[:200]} is set {counts[key]} times in the container (the image's "
            "and the pod's, say): containerd's NRI keeps the last of them whatever a plugin sets, so "
            "kubegpu cannot give it its value; set it once, or not at all"
        )
    return changes


def adjustment(
    before: ContainerSpec, after: ContainerSpec, number_of: Callable[[str], DeviceNumber]
) -> api_pb2.ContainerAdjustment:
    """What containerd must change to make the container ``before`` into ``after`` (the core's
    result): removals of what the scrub or the plugins' edits took out, then additions. Raises
    ``Ambiguous`` for a change NRI cannot make (``_env_changes``)."""
    adjust = api_pb2.ContainerAdjustment()
    for key, value in _env_changes(before, after):
        adjust.env.add(key=key, value=value.decode("utf-8", "surrogateescape"))

    kept_mounts = {id(m.origin) for m in after.mounts if m.origin is not None}
    for mount in before.mounts:
        if id(mount.origin) not in kept_mounts:
            adjust.mounts.add(destination=REMOVE + mount.container_path)
    for mount in after.mounts:
        if mount.origin is None:
            options = [*BIND_OPTIONS, "ro" if mount.readonly else "rw"]
            adjust.mounts.add(
                destination=mount.container_path, type="bind", source=mount.host_path, options=options
            )

    kept_devices = {id(d.origin) for d in after.devices if d.origin is not None}
    for device in before.devices:
        if id(device.origin) not in kept_devices:
            adjust.linux.devices.add(path=REMOVE + device.container_path)
            if _deniable(device.number):
                assert device.number is not None
                deny = adjust.linux.resources.devices.add(allow=False, type=device.number.kind, access="rwm")
                deny.major.value, deny.minor.value = device.number.major, device.number.minor
    for device in after.devices:
        if device.origin is None:
            number = number_of(device.host_path)
            added = adjust.linux.devices.add(
                path=device.container_path, type=number.kind, major=number.major, minor=number.minor
            )
            added.file_mode.value = 0o666

    # CDI names the scrub took out cannot be taken back (containerd injected them before NRI);
    # the devices they injected are in ``devices`` and judged there by number.
    for name in after.cdi_devices:
        if name not in before.cdi_devices:
            adjust.CDI_devices.add(name=name)

    for key, value in after.annotations.items():
        if before.annotations.get(key) != value:
            adjust.annotations[key] = value
    for key in before.annotations:
        if key not in after.annotations:
            adjust.annotations[REMOVE + key] = ""
    return adjust


def _rule_reaches(rule: api_pb2.LinuxDeviceCgroup, number: DeviceNumber) -> bool:
    """Whether a device cgroup rule covers ``number`` (type ``a`` or empty, a missing major or
    minor: every one)."""
    if rule.type not in ("", "a", number.kind):
        return False
    if rule.HasField("major") and rule.major.value not in (-1, number.major):
        return False
    return not rule.HasField("minor") or rule.minor.value in (-1, number.minor)


def _rule_opens_managed(
    rule: api_pb2.LinuxDeviceCgroup, managed: ManagedDevices, granted: frozenset[DeviceNumber]
) -> str | None:
    """The managed device (not granted, not one of runc's own) an allow rule lets the container
    open, as text; None if it opens none."""
    if not rule.allow or (rule.access and not set(rule.access) & set("rw")):
        return None  # a deny rule, or mknod alone (runc allows that for every device anyway)
    for number in sorted(managed.numbers, key=lambda n: (n.kind, n.major, n.minor)):
        if _deniable(number) and number not in granted and _rule_reaches(rule, number):
            return str(number)
    for major in sorted(managed.char_majors):
        minor = rule.minor.value if rule.HasField("minor") else 0
        if not _rule_reaches(rule, DeviceNumber(CHAR, major, minor)):
            continue
        if not rule.HasField("minor") or rule.minor.value < 0:
            return f"{CHAR} {major}:*"
        if DeviceNumber(CHAR, major, rule.minor.value) not in granted:
            return f"{CHAR} {major}:{rule.minor.value}"
    return None


def foreign_grant(
    final: api_pb2.ContainerAdjustment, ours: api_pb2.ContainerAdjustment, managed: ManagedDevices
) -> str | None:
    """Why the adjustments of every NRI plugin together (``final``, what containerd validates)
    reach a managed device the agent's own answer (``ours``) did not give, or undo that answer;
    None when they do neither.

    Other plugins' adjustments never pass through the scrub (containerd applies CDI names and
    device cgroup rules after every plugin has answered, and a plugin may remove a variable or
    annotation another set), so they are judged here by the scrub's own rules: device nodes and
    device cgroup rules by number, toolkit selectors, device-list mounts, managed CDI names and
    CDI or kubegpu.io annotations. The agent's variables and annotations (the neutral selectors,
    the granted ones, the ledger's mark) must reach the container as it answered them."""
    final_env = {(kv.key, kv.value) for kv in final.env}
    for kv in ours.env:
        if (kv.key, kv.value) not in final_env:
            return f"an NRI plugin removed or changed {kv.key}={kv.value!r}, which kubegpu set"
    final_annotations = dict(final.annotations)
    for key, value in ours.annotations.items():
        if not key.startswith(REMOVE) and final_annotations.get(key) != value:
            return f"an NRI plugin removed or changed the annotation {key!r}, which kubegpu set"

    our_env = {(kv.key, kv.value) for kv in ours.env}
    neutral = dict(edits.NEUTRAL_ENV)
    for kv in final.env:
        if (kv.key, kv.value) in our_env or kv.key.startswith(REMOVE) or not edits.is_scrubbed_env(kv.key):
            continue
        if kv.value != neutral.get(kv.key.upper(), ""):
            return f"an NRI plugin set {kv.key}={kv.value[:200]!r}, a device selector kubegpu did not set"

    our_mounts = {m.SerializeToString(deterministic=True) for m in ours.mounts}
    for mount in final.mounts:
        if mount.destination.startswith(REMOVE) or mount.SerializeToString(deterministic=True) in our_mounts:
            continue
        if edits.is_device_request_mount(mount.destination):
            where = mount.destination[:200]
            return f"an NRI plugin mounted {where!r}, a device request of the NVIDIA toolkit"

    our_cdi = {c.name for c in ours.CDI_devices}
    for cdi in final.CDI_devices:
        if cdi.name in our_cdi:
            continue
        try:
            managed_name = edits.is_scrubbed_cdi(cdi.name)
        except Ambiguous:
            managed_name = True
        if managed_name:
            return f"an NRI plugin added the CDI device {cdi.name[:200]!r}, which kubegpu did not grant"

    for key, value in final.annotations.items():
        if key.startswith(REMOVE) or ours.annotations.get(key) == value:
            continue
        if edits.is_scrubbed_annotation(key):
            return f"an NRI plugin set the annotation {key[:200]!r}, which only kubegpu writes"
        if edits.is_cdi_annotation(key):
            try:
                kept = edits.scrubbed_cdi_annotation(key, value) == value
            except Ambiguous:
                kept = False
            if not kept:
                asked = f"{key[:200]!r}={value[:200]!r}"
                return f"an NRI plugin set the CDI annotation {asked}, naming a managed device"

    granted = frozenset(
        DeviceNumber(d.type, d.major, d.minor) for d in ours.linux.devices if not d.path.startswith(REMOVE)
    )
    for device in final.linux.devices:
        kind = DEVICE_KINDS.get(device.type)
        if device.path.startswith(REMOVE) or kind is None:
            continue
        number = DeviceNumber(kind, device.major, device.minor)
        if managed.has_number(number) and number not in granted:
            path = device.path[:200]
            return f"an NRI plugin added {path} ({number}), a managed device kubegpu did not grant"

    our_rules = {r.SerializeToString(deterministic=True) for r in ours.linux.resources.devices}
    for rule in final.linux.resources.devices:
        if rule.SerializeToString(deterministic=True) in our_rules:
            continue
        reached = _rule_opens_managed(rule, managed, granted)
        if reached is not None:
            major = rule.major.value if rule.HasField("major") else "*"
            minor = rule.minor.value if rule.HasField("minor") else "*"
            return (
                f"an NRI plugin allowed {rule.access or 'rwm'} on {rule.type or 'a'} {major}:{minor} in the "
                f"device cgroup, which reaches {reached}, a managed device kubegpu did not grant"
            )
    return None
