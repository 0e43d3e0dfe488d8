"""The NRI front's translation (crishim/nri/front.py): an NRI container into the rewrite core's
ContainerSpec, the core's scrub and edits on it, and the adjustment containerd would apply."""

from __future__ import annotations

import pytest

from crishim import edits
from crishim.hostpaths import CHAR, Ambiguous, DeviceNumber, ManagedDevices
from crishim.nri import api_pb2
from crishim.nri.front import adjustment, spec_from_nri
from devices.plugin import ContainerEdits, DeviceNode, Mount

MANAGED = ManagedDevices(numbers=frozenset({DeviceNumber(CHAR, 195, 0), DeviceNumber(CHAR, 195, 255)}))
HOST_NUMBERS = {"/dev/nvidia1": DeviceNumber(CHAR, 195, 1), "/dev/nvidiactl": DeviceNumber(CHAR, 195, 255)}


def container() -> api_pb2.Container:
    c = api_pb2.Container(id="c1", name="app", pod_sandbox_id="s1")
    c.env.extend(["PATH=/bin", "NVIDIA_VISIBLE_DEVICES=all", "KUBEGPU_X=1", "HOME=/root"])
    c.mounts.add(destination="/data", type="bind", source="/srv/data", options=["rbind", "ro"])
    c.mounts.add(destination="/var/run/nvidia-container-devices/all", type="bind", source="/dev/null")
    c.linux.devices.add(path="/dev/fuse", type="c", major=10, minor=229)
    c.linux.devices.add(path="/dev/my-gpu", type="c", major=195, minor=0)  # a managed node, renamed
    c.annotations["io.kubernetes.container.restartCount"] = "0"
    c.annotations["kubegpu.io/forged"] = "x"
    return c


def test_scrub_through_nri_removes_what_reaches_managed_devices_by_number() -> None:
    before = spec_from_nri(container())
    after = before.copy()
    edits.scrub_spec(after, MANAGED)
    adjust = adjustment(before, after, HOST_NUMBERS.__getitem__)
    env = [(kv.key, kv.value) for kv in adjust.env]
    assert ("KUBEGPU_X", "") in env  # emptied: NRI never removes env from the OCI spec
    assert ("NVIDIA_VISIBLE_DEVICES", "void") in env and ("NVIDIA_GDS", "disabled") in env
    assert not any(key in ("PATH", "HOME", "-PATH", "-HOME") for key, _ in env)
    assert [m.destination for m in adjust.mounts] == ["-/var/run/nvidia-container-devices/all"]
    assert [d.path for d in adjust.linux.devices] == ["-/dev/my-gpu"]
    (deny,) = adjust.linux.resources.devices  # NRI v0.11 drops the removal: the cgroup denies it
    assert (deny.allow, deny.type, deny.major.value, deny.minor.value, deny.access) == (
        False,
        "c",
        195,
        0,
        "rwm",
    )
    assert dict(adjust.annotations) == {"-kubegpu.io/forged": ""}


def test_granted_devices_and_mounts_are_added_with_their_host_numbers() -> None:
    before = spec_from_nri(container())
    after = before.copy()
    edits.scrub_spec(after, MANAGED)
    granted = ContainerEdits(
        device_nodes=(
            DeviceNode("/dev/nvidia1", "/dev/nvidia1"),
            DeviceNode("/dev/nvidiactl", "/dev/nvidiactl"),
        ),
        env={"NVIDIA_VISIBLE_DEVICES": "GPU-1"},
        mounts=(Mount("/usr/lib/nv", "/run/libs", readonly=True),),
    )
    edits.apply_spec(after, granted)
    after.annotations["kubegpu.io/mark"] = "m"
    adjust = adjustment(before, after, HOST_NUMBERS.__getitem__)
    added = {d.path: (d.type, d.major, d.minor, d.file_mode.value) for d in adjust.linux.devices}
    assert added == {
        "-/dev/my-gpu": ("", 0, 0, 0),
        "/dev/nvidia1": ("c", 195, 1, 0o666),
        "/dev/nvidiactl": ("c", 195, 255, 0o666),
    }
    assert ("NVIDIA_VISIBLE_DEVICES", "GPU-1") in [(kv.key, kv.value) for kv in adjust.env]
    mounts = {m.destination: (m.source, list(m.options)) for m in adjust.mounts}
    assert mounts["/run/libs"] == ("/usr/lib/nv", ["rbind", "rprivate", "ro"])
    assert adjust.annotations["kubegpu.io/mark"] == "m"


def test_an_unchanged_container_needs_no_adjustment() -> None:
    plain = api_pb2.Container(name="app")
    plain.env.extend(["A=1"])
    before = spec_from_nri(plain)
    after = before.copy()
    assert adjustment(before, after, HOST_NUMBERS.__getitem__) == api_pb2.ContainerAdjustment()


@pytest.mark.parametrize(
    "broken",
    [
        lambda c: c.env.append("NOEQUALS"),
        lambda c: c.linux.devices.add(path="/dev/x", type="z", major=1, minor=1),
    ],
)
def test_what_the_front_cannot_read_is_ambiguous(broken) -> None:  # type: ignore[no-untyped-def]
    c = container()
    broken(c)
    with pytest.raises(Ambiguous):
        spec_from_nri(c)


def test_a_fifo_is_kept_and_a_unbuffered_char_device_is_judged_as_char() -> None:
    c = api_pb2.Container(name="app")
    c.linux.devices.add(path="/dev/pipe", type="p")
    c.linux.devices.add(path="/dev/u", type="u", major=195, minor=0)
    spec = spec_from_nri(c)
    edits.scrub_spec(spec, MANAGED)
    assert [d.container_path for d in spec.devices] == ["/dev/pipe"]


def test_runc_default_devices_are_never_denied() -> None:
    c = api_pb2.Container(name="app")
    c.linux.devices.add(path="/dev/sim-null", type="c", major=1, minor=3)
    before = spec_from_nri(c)
    after = before.copy()
    edits.scrub_spec(after, ManagedDevices(numbers=frozenset({DeviceNumber(CHAR, 1, 3)})))
    adjust = adjustment(before, after, HOST_NUMBERS.__getitem__)
    assert [d.path for d in adjust.linux.devices] == ["-/dev/sim-null"] and not adjust.linux.resources.devices
