"""Fuzz the scrub: generated device entries, mounts, environment, CDI names and annotations.

Each case is a CreateContainer for a pod with a validly signed allocation (granting this
container some fake GPUs, or none) and a hostile config: managed device nodes under many
spellings (``/./``, ``//``, ``..``, ``..`` after a symlink, symlinks, ``/dev/char/M:m``, their
directory), toolkit device-list mounts in any spelling, toolkit environment (also from the
"image", which the shim never sees), CDI names and annotations in any case, duplicates, unicode
look-alikes.

One oracle, computed here from models of containerd and the NVIDIA toolkit (never from the
shim's own code): after the rewrite, the container reaches no managed device node and makes no
toolkit request beyond its allocation. A refusal (INVALID_ARGUMENT) is allowed only for a
request this file's model also calls undecidable; every other request must be accepted.

The fake GPUs are real character device nodes (major 240, a number reserved for local use)
made with mknod in a private directory: the shim must compare device numbers, as containerd does.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import re
import stat
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import grpc
import pytest

from crishim.cri import api_pb2
from crishim.intercept import Rejected
from crishim.rewrite import AllocationRewriter, NodeDevices
from devices.model import Device, DeviceKind, NodeInventory
from devices.plugin import ContainerEdits, DeviceNode, GpuShare
from kubegpu.allocation import ANNOTATION, Allocation, ContainerAllocation, KeyRing, sign
from tests.fixtures.common import missing_component
from tests.fixtures.keys import SIGNING

NODE, UID, CONTAINER = "scrub-node", "5c2b0000-0000-4000-8000-00000000fuzz", "app"
CASES = 1500
MAJOR, CTL_MINOR = 240, 255
GPU_COUNT = 4
UUIDS = [f"GPU-fake-{i}" for i in range(GPU_COUNT)]
ROOT = "/var/run/nvidia-container-devices"
NVIDIA_CDI_VENDORS = {"nvidia.com", "management.nvidia.com", "k8s.device-plugin.nvidia.com"}
TOOLKIT_ANNOTATION_PREFIXES = ("cdi.k8s.io/", "nvidia.cdi.k8s.io/")
FEATURES = ("NVIDIA_GDS", "NVIDIA_MOFED", "NVIDIA_NVSWITCH", "NVIDIA_GDRCOPY")


class FakeGpus:
    """A device plugin whose GPUs are char devices 240:i and a control node 240:255."""

    name = "fakegpu"
    kinds = frozenset({DeviceKind.GPU})

    def __init__(self, dev_dir: Path) -> None:
        self.dev_dir = dev_dir
        self.device_patterns = (f"{dev_dir}/fakegpu*", f"{dev_dir}/fakectl")

    def node(self, index: int) -> str:
        return str(self.dev_dir / f"fakegpu{index}")

    @property
    def ctl(self) -> str:
        return str(self.dev_dir / "fakectl")

    def discover(self) -> NodeInventory:
        return NodeInventory(
            tuple(
                Device(id=UUIDS[i], kind=DeviceKind.GPU, index=i, model="fake", device_nodes=(self.node(i),))
                for i in range(GPU_COUNT)
            )
        )

    def health(self) -> dict[str, bool]:
        return dict.fromkeys(UUIDS, True)

    def container_edits(
        self, devices: Sequence[Device], shares: Mapping[str, GpuShare] | None = None
    ) -> ContainerEdits:
        nodes = [DeviceNode(d.device_nodes[0], f"/dev/nvidia{d.index}") for d in devices]
        return ContainerEdits(
            device_nodes=(*nodes, DeviceNode(self.ctl, "/dev/nvidiactl")),
            env={"NVIDIA_VISIBLE_DEVICES": ",".join(d.id for d in devices)},
        )


# --- models of containerd and the NVIDIA toolkit (the oracle) ---------------------------------------


def go_clean(path: str) -> str:
    """Go's filepath.Clean (for absolute paths and, as Go does, for relative ones)."""
    absolute = path.startswith("/")
    out: list[str] = []
    for part in path.split("/"):
        if part in ("", "."):
            continue
        if part == "..":
            if out and out[-1] != "..":
                out.pop()
            elif not absolute:
                out.append("..")
            continue
        out.append(part)
    joined = "/".join(out)
    return "/" + joined if absolute else (joined or ".")


def containerd_devices(host_path: str) -> list[tuple[int, int]]:
    """(major, minor) of the char devices a CRI device entry gives the container (containerd's
    WithDevices: follow symlinks; a directory gives every device node below it, not following
    symlinks inside it). A path containerd cannot open gives nothing (the create fails)."""
    if not host_path.startswith("/") or "\x00" in host_path:
        return []
    try:
        top = os.stat(host_path)
    except OSError:
        return []
    if stat.S_ISCHR(top.st_mode):
        return [(os.major(top.st_rdev), os.minor(top.st_rdev))]
    found = []
    if stat.S_ISDIR(top.st_mode):
        for dirpath, dirnames, filenames in os.walk(host_path):
            for name in dirnames + filenames:
                st = os.lstat(os.path.join(dirpath, name))
                if stat.S_ISCHR(st.st_mode):
                    found.append((os.major(st.st_rdev), os.minor(st.st_rdev)))
    return found


def containerd_env(image_env: Iterable[str], config: api_pb2.ContainerConfig) -> dict[str, str]:
    """The process environment the toolkit reads: image env, then the CRI envs (last one wins)."""
    env: dict[str, str] = {}
    for entry in [*image_env, *(kv.key + "=" + kv.value.decode("utf-8", "replace") for kv in config.envs)]:
        key, sep, value = entry.partition("=")
        if sep:
            env[key] = value
    return env


def toolkit_list(value: str | None) -> list[str]:
    """The toolkit's reading of a device-list variable: void/none/empty select nothing."""
    if value is None:
        return []
    items = [d.strip() for d in value.split(",") if d.strip()]
    if not items or "void" in items or "none" in items:
        return []
    return ["all"] if "all" in items else items


def toolkit_requests(
    config: api_pb2.ContainerConfig, sandbox: api_pb2.PodSandboxConfig, image_env: list[str]
) -> dict[str, list[str]]:
    """What the NVIDIA toolkit would give the container, with every request path turned on
    (volume mounts accepted, env accepted when unprivileged, CDI annotations with both prefixes
    passed through from the pod and the container)."""
    env = containerd_env(image_env, config)
    annotations = {**dict(sandbox.annotations), **dict(config.annotations)}
    # Entries of another vendor are that vendor's devices, not GPUs: only NVIDIA's count here
    # (compared leniently: any case, blanks around the vendor ignored), and with none of them the
    # other request paths are looked at too, which is stricter than the toolkit's precedence.
    from_annotations = [
        d
        for key, value in sorted(annotations.items())
        if key.startswith(TOOLKIT_ANNOTATION_PREFIXES)
        for d in value.split(",")
        if lenient_vendor(d) in NVIDIA_CDI_VENDORS
    ]
    from_mounts = []
    for mount in config.mounts:
        source = os.path.realpath(mount.host_path) if mount.host_path.startswith("/") else mount.host_path
        destination = go_clean(mount.container_path)
        if go_clean(source) == "/dev/null" and destination.startswith(ROOT):
            request = destination[len(ROOT) :].strip("/")
            if request:
                from_mounts.append(request)
    visible = from_annotations or [m for m in from_mounts if not m.startswith("imex/")]
    if not visible:
        visible = toolkit_list(env.get("NVIDIA_VISIBLE_DEVICES"))
        if (
            "NVIDIA_VISIBLE_DEVICES" not in env
            and env.get("CUDA_VERSION")
            and not env.get("NVIDIA_REQUIRE_CUDA")
        ):
            visible = ["all"]  # a legacy CUDA image without the variable gets every GPU
    imex = [m for m in from_mounts if m.startswith("imex/")] or [
        c for c in toolkit_list(env.get("NVIDIA_IMEX_CHANNELS")) if c != "all"
    ]
    cdi = [c.name for c in config.CDI_devices]
    cdi += [
        d
        for key, value in annotations.items()
        if key.lower().startswith(TOOLKIT_ANNOTATION_PREFIXES)
        for d in value.split(",")
    ]
    features = [f for f in FEATURES if visible and env.get(f) == "enabled"]
    return {"visible": visible, "imex": imex, "cdi": cdi, "features": features}


def violations(
    config: api_pb2.ContainerConfig,
    sandbox: api_pb2.PodSandboxConfig,
    image_env: list[str],
    granted: list[int],
) -> list[str]:
    """What the container could reach beyond its allocation (empty: nothing)."""
    allowed = {(MAJOR, i) for i in granted} | ({(MAJOR, CTL_MINOR)} if granted else set())
    problems = []
    for entry in config.devices:
        for number in containerd_devices(entry.host_path):
            if number[0] == MAJOR and number not in allowed:
                problems.append(f"device entry {entry.host_path!r} reaches {number}")
    requests = toolkit_requests(config, sandbox, image_env)
    allowed_ids = {UUIDS[i] for i in granted}
    for device in requests["visible"]:
        if device not in allowed_ids:
            problems.append(f"toolkit would give {device!r}")
    problems += [f"IMEX channel {c!r}" for c in requests["imex"]]
    for name in requests["cdi"]:
        vendor = lenient_vendor(name)
        if vendor in NVIDIA_CDI_VENDORS and name.partition("=")[2] not in allowed_ids:
            problems.append(f"CDI device {name!r}")
    problems += [f"feature {f} adds device nodes" for f in requests["features"]]
    return problems


def lenient_vendor(name: str) -> str:
    """The vendor of a CDI name as a reader more lenient than containerd could see it."""
    return name.split("/", 1)[0].strip().lower()


def strictly_qualified(name: str) -> bool:
    """containerd's (the CDI library's) grammar for a qualified name, written out again here."""
    part = r"[A-Za-z]([\w.-]*[A-Za-z0-9])?"
    return bool(re.fullmatch(rf"{part}/{part}=[A-Za-z0-9]([\w.:-]*[A-Za-z0-9])?", name)) and name.isascii()


def other_vendors_requests(config: api_pb2.ContainerConfig, sandbox: api_pb2.PodSandboxConfig) -> set[str]:
    """The qualified CDI annotation entries of vendors we do not manage: the scrub must keep them."""
    return {
        f"{side}:{key}:{d}"
        for side, where in (("container", config.annotations), ("pod", sandbox.annotations))
        for key, value in where.items()
        if "cdi.k8s.io/" in key.lower()
        for d in value.split(",")
        if strictly_qualified(d)
        and lenient_vendor(d) not in {*NVIDIA_CDI_VENDORS, "kubegpu.io"}
        and not lenient_vendor(d).endswith(".nvidia.com")
    }


def undecidable(config: api_pb2.ContainerConfig, sandbox: api_pb2.PodSandboxConfig) -> list[str]:
    """Requests the shim may refuse because it cannot tell what they give (this file's own rules);
    any other request must be accepted."""
    reasons = []
    for where in (config.annotations, sandbox.annotations):
        for key, value in where.items():
            if "cdi.k8s.io/" in key.lower():
                reasons += [
                    f"CDI annotation entry {d!r}"
                    for d in value.split(",")
                    if not strictly_qualified(d) and ("nvidia.com" in d.lower() or "kubegpu.io" in d.lower())
                ]
    for entry in config.devices:
        path = entry.host_path
        if not path.startswith("/") or "\x00" in path:
            reasons.append(f"device path {path!r}")
            continue
        try:
            top = os.stat(path)
        except FileNotFoundError:
            continue
        except OSError:
            reasons.append(f"unresolvable {path!r}")
            continue
        if stat.S_ISDIR(top.st_mode) and any(n[0] == MAJOR for n in containerd_devices(path)):
            reasons.append(f"directory {path!r} with managed nodes")
    for kv in config.envs:
        if "=" in kv.key or "\x00" in kv.key or b"\x00" in kv.value:
            reasons.append(f"env {kv.key!r}")
    for mount in config.mounts:
        if "\x00" in mount.container_path:
            reasons.append("mount with NUL")
    for cdi in config.CDI_devices:
        vendor, slash, rest = cdi.name.partition("/")
        if not slash or "=" not in rest or not vendor.strip():
            reasons.append(f"CDI name {cdi.name!r}")
    return reasons


# --- the generator ------------------------------------------------------------------------------


def spellings(path: str, rng: random.Random) -> str:
    """The same path, spelled another way."""
    head, name = os.path.split(path)
    parent = os.path.basename(head)
    choice = rng.randrange(8)
    if choice == 0:
        return f"{head}/./{name}"
    if choice == 1:
        return f"{head}//{name}"
    if choice == 2:
        return f"{head}/../{parent}/{name}"
    if choice == 3:
        return f"/{path}"
    if choice == 4:
        return f"{head}/{name}/."
    if choice == 5:
        return path.replace("/", "//")
    if choice == 6:
        return f"{head}/{name.upper()}"
    return path


def random_case(
    rng: random.Random, fake: FakeGpus, links: dict[str, str]
) -> tuple[dict[str, Any], list[int]]:
    granted = sorted(rng.sample(range(GPU_COUNT), rng.randrange(0, 3)))
    targets = [fake.node(i) for i in range(GPU_COUNT)] + [fake.ctl]
    devices = []
    for _ in range(rng.randrange(0, 4)):
        roll = rng.random()
        if roll < 0.35:
            host = spellings(rng.choice(targets), rng)
        elif roll < 0.5:
            host = rng.choice(list(links))
        elif roll < 0.55:
            host = f"/dev/char/{MAJOR}:{rng.randrange(GPU_COUNT)}"
        elif roll < 0.58:
            host = rng.choice(
                [str(fake.dev_dir), spellings(str(fake.dev_dir), rng), str(fake.dev_dir.parent)]
            )
        elif roll < 0.75:
            host = rng.choice(["/dev/null", "/dev/zero", "/dev/./null", "/dev/full", "/dev/does-not-exist"])
        elif roll < 0.77:
            host = rng.choice(["dev/fakegpu0", "fakegpu0", "", "/dev/null\x00", "/dev/ｆake"])
        else:
            host = rng.choice(targets).replace("fakegpu", "ｆakegpu")
        container = rng.choice(["/dev/x", "/dev/nvidia0", f"/dev/nvidia{rng.randrange(8)}", host or "/dev/y"])
        devices.append({"host_path": host, "container_path": container})
    mounts = []
    for _ in range(rng.randrange(0, 4)):
        root = rng.choice(
            [
                ROOT,
                "/var/run//nvidia-container-devices",
                "/var/run/./nvidia-container-devices",
                "/run/../var/run/nvidia-container-devices",
                "/var/run/nvidia-container-devices/../nvidia-container-devices",
                "var/run/nvidia-container-devices",
                "/VAR/RUN/nvidia-container-devices",
                "/var/run/nvidia-container-devicesX/..",
                "/run/nvidia-container-devices",
                "/data",
            ]
        )
        request = rng.choice(
            ["/all", "all", "/0", f"/{rng.choice(UUIDS)}", "/imex/0", "/cdi/nvidia.com/gpu/all", "/"]
        )
        host = rng.choice(["/dev/null", "/dev//null", "/dev/./null", "/tmp", "/dev/zero"])
        mounts.append({"host_path": host, "container_path": root + request})
    env_keys = [
        "NVIDIA_VISIBLE_DEVICES",
        "nvidia_visible_devices",
        "NVIDIA_IMEX_CHANNELS",
        "NVIDIA_MOFED",
        "NVIDIA_GDS",
        "NVIDIA_NVSWITCH",
        "NVIDIA_GDRCOPY",
        "KUBEGPU_VISIBLE_DEVICES",
        "CUDA_VISIBLE_DEVICES",
        "HOME",
    ]
    env_values = [
        "all",
        "0",
        "void",
        "none",
        "",
        UUIDS[0],
        ",".join(UUIDS),
        "enabled",
        "0,1",
        "nvidia.com/gpu=all",
    ]
    envs = []
    for _ in range(rng.randrange(0, 5)):
        key = rng.choice(env_keys)
        if rng.random() < 0.02:
            key = key + "=" + rng.choice(env_values)
        if rng.random() < 0.01:
            key = key + "\x00"
        envs.append((key, rng.choice(env_values)))
    image_env = [f"{rng.choice(env_keys)}={rng.choice(env_values)}" for _ in range(rng.randrange(0, 4))]
    if rng.random() < 0.2:
        image_env.append("CUDA_VERSION=12.4.0")
    cdi = []
    for _ in range(rng.randrange(0, 3)):
        vendor = rng.choice(
            [
                "nvidia.com",
                "NVIDIA.COM",
                " nvidia.com",
                "management.nvidia.com",
                "k8s.device-plugin.nvidia.com",
                "kubegpu.io",
                "vendor.example",
            ]
        )
        name = f"{vendor}/gpu={rng.choice(['all', '0', UUIDS[0]])}"
        cdi.append(name if rng.random() < 0.9 else rng.choice([f"{vendor}/gpu", "junk"]))
    annotation_keys = [
        "cdi.k8s.io/x",
        "CDI.K8S.IO/x",
        "nvidia.cdi.k8s.io/y",
        "kubegpu.io/devices",
        "keep.me/x",
        "io.kubernetes.cri/x",
    ]
    annotation_values = [
        "nvidia.com/gpu=all",
        "x",
        "example.com/net=eth1",  # another vendor's device: kept
        "nvidia.com/gpu=0,example.com/net=eth1",
        "NVIDIA.COM/gpu=all",
        " nvidia.com/gpu=0",  # not qualified, names a managed vendor: refused
        "example.com/net=eth1, nvidia.com/gpu=all",
    ]
    annotations = {
        rng.choice(annotation_keys): rng.choice(annotation_values) for _ in range(rng.randrange(3))
    }
    pod_annotations = {
        rng.choice(annotation_keys[:3]): rng.choice(annotation_values[:5]) for _ in range(rng.randrange(2))
    }
    privileged = False
    return (
        {
            "devices": devices,
            "mounts": mounts,
            "envs": envs,
            "image_env": image_env,
            "cdi": cdi,
            "annotations": annotations,
            "pod_annotations": pod_annotations,
            "privileged": privileged,
        },
        granted,
    )


def make_request(case: dict[str, Any], granted: list[int]) -> api_pb2.CreateContainerRequest:
    request = api_pb2.CreateContainerRequest(pod_sandbox_id="sb")
    meta = request.sandbox_config.metadata
    meta.name, meta.namespace, meta.uid = "scrub", "default", UID
    if granted:
        allocation = Allocation(NODE, UID, {CONTAINER: ContainerAllocation(tuple(UUIDS[i] for i in granted))})
        request.sandbox_config.annotations[ANNOTATION] = sign(allocation, "k1", SIGNING["k1"])
    request.sandbox_config.annotations.update(case["pod_annotations"])
    config = request.config
    config.metadata.name = CONTAINER
    for key, value in case["envs"]:
        config.envs.add(key=key, value=value.encode())
    for entry in case["devices"]:
        config.devices.add(
            host_path=entry["host_path"], container_path=entry["container_path"], permissions="rwm"
        )
    for mount in case["mounts"]:
        config.mounts.add(host_path=mount["host_path"], container_path=mount["container_path"])
    for name in case["cdi"]:
        config.CDI_devices.add(name=name)
    config.annotations.update(case["annotations"])
    return request


@pytest.fixture
def fake_gpus(tmp_path: Path) -> tuple[FakeGpus, dict[str, str]]:
    dev_dir = tmp_path / "dev"
    dev_dir.mkdir()
    fake = FakeGpus(dev_dir)
    try:
        for i in range(GPU_COUNT):
            os.mknod(fake.node(i), stat.S_IFCHR | 0o600, os.makedev(MAJOR, i))
        os.mknod(fake.ctl, stat.S_IFCHR | 0o600, os.makedev(MAJOR, CTL_MINOR))
    except PermissionError:
        missing_component("the scrub fuzz makes device nodes with mknod: it needs root (CAP_MKNOD)")
    links_dir = tmp_path / "links"
    (links_dir / "char").mkdir(parents=True)
    links = {}
    for i in range(GPU_COUNT):
        udev_style = links_dir / "char" / f"{MAJOR}:{i}"
        udev_style.symlink_to(fake.node(i))
        links[str(udev_style)] = fake.node(i)
        chained = links_dir / f"chain{i}"
        chained.symlink_to(udev_style)
        links[str(chained)] = fake.node(i)
    # Nodes with managed numbers outside the plugin's paths: only device numbers tell.
    for i in range(GPU_COUNT):
        alias = links_dir / f"alias{i}"
        os.mknod(alias, stat.S_IFCHR | 0o600, os.makedev(MAJOR, i))
        links[str(alias)] = fake.node(i)
    (links_dir / "devdir").symlink_to(dev_dir)
    links[str(links_dir / "devdir")] = str(dev_dir)
    links[str(links_dir / "devdir" / "fakegpu1")] = fake.node(1)
    links[str(links_dir / "dangling")] = "/nonexistent"
    # ``..`` after a symlink goes up from the link's target: <links>/up/../fakegpuN is dev_dir's.
    (dev_dir / "sub").mkdir()
    (links_dir / "up").symlink_to(dev_dir / "sub")
    for i in range(GPU_COUNT):
        links[f"{links_dir}/up/../fakegpu{i}"] = fake.node(i)
    (links_dir / "dangling").symlink_to("/nonexistent")
    return fake, links


def test_the_scrub_leaves_nothing_beyond_the_allocation(fake_gpus: tuple[FakeGpus, dict[str, str]]) -> None:
    fake, links = fake_gpus
    node_devices = NodeDevices([fake], sysfs_root=None)
    node_devices.discover()
    rewriter = AllocationRewriter(NODE, node_devices, KeyRing(None, {"k1": SIGNING["k1"].public_key()}))
    rewriter.rebuilt.set()
    rng = random.Random(1126)
    tally = {"accepted": 0, "refused": 0, "granted": 0, "hostile_removed": 0, "others_kept": 0}

    async def run() -> None:
        for number in range(CASES):
            case, granted = random_case(rng, fake, links)
            request = make_request(case, granted)
            before = violations(request.config, request.sandbox_config, case["image_env"], [])
            reasons = undecidable(request.config, request.sandbox_config)
            others = other_vendors_requests(request.config, request.sandbox_config)
            try:
                rewritten, completion = await rewriter.create_container(request)
            except Rejected as rejected:
                assert rejected.code is grpc.StatusCode.INVALID_ARGUMENT, rejected.message
                assert reasons, (number, case, rejected.message)  # refused only what is undecidable
                assert "pod default/scrub" in rejected.message
                tally["refused"] += 1
                continue
            found = violations(rewritten.config, rewritten.sandbox_config, case["image_env"], granted)
            assert not found, (number, json.dumps(case, default=str), found)
            kept = other_vendors_requests(rewritten.config, rewritten.sandbox_config)
            assert others <= kept, (number, json.dumps(case, default=str), others - kept)
            tally["others_kept"] += bool(others)
            if granted:  # the allocation itself arrives intact
                reached = {n for d in rewritten.config.devices for n in containerd_devices(d.host_path)}
                assert {(MAJOR, i) for i in granted} | {(MAJOR, CTL_MINOR)} <= reached
                env = containerd_env(case["image_env"], rewritten.config)
                assert toolkit_list(env["NVIDIA_VISIBLE_DEVICES"]) == [UUIDS[i] for i in granted]
                assert completion is not None
                completion(None, False)
                tally["granted"] += 1
            tally["accepted"] += 1
            tally["hostile_removed"] += bool(before)

    asyncio.run(run())
    assert tally["refused"] > CASES // 20 and tally["granted"] > CASES // 4, tally
    assert tally["hostile_removed"] > CASES // 2 and tally["others_kept"] > CASES // 20, tally


def test_the_model_sees_what_an_unscrubbed_request_reaches(
    fake_gpus: tuple[FakeGpus, dict[str, str]],
) -> None:
    """The oracle is not blind: the requests it is fed do reach devices when nothing scrubs them."""
    fake, links = fake_gpus
    rng = random.Random(7)
    hits = 0
    for _ in range(300):
        case, _ = random_case(rng, fake, links)
        request = make_request(case, [])
        hits += bool(violations(request.config, request.sandbox_config, case["image_env"], []))
    assert hits > 150
    config = api_pb2.ContainerConfig()
    config.devices.add(host_path=f"{fake.dev_dir}/./fakegpu0", container_path="/dev/x")
    config.mounts.add(host_path="/dev/null", container_path="/var/run/nvidia-container-devicesall")
    found = violations(config, api_pb2.PodSandboxConfig(), ["NVIDIA_VISIBLE_DEVICES=all"], [])
    assert any("reaches (240, 0)" in f for f in found) and "toolkit would give 'all'" in found
