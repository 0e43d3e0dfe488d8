"""The scrub's decisions one by one: canonical paths, device numbers, toolkit requests, refusals.

(The fuzz in test_crishim_scrub_fuzz.py checks the same property on generated requests; the
real-containerd proof is in test_crishim_rewrite.py.)
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from crishim import edits
from crishim.cri import api_pb2
from crishim.hostpaths import (
    CHAR,
    Ambiguous,
    DeviceNumber,
    ManagedDevices,
    clean,
    device_entry_verdict,
)
from crishim.rewrite import NodeDevices
from devices.registry import load_plugins
from tests.fixtures.common import missing_component

NULL = DeviceNumber(CHAR, 1, 3)


def scrubbed(managed: ManagedDevices, **fields: list[tuple[str, str]]) -> api_pb2.ContainerConfig:
    config = api_pb2.ContainerConfig()
    for host, inside in fields.get("devices", []):
        config.devices.add(host_path=host, container_path=inside)
    for host, inside in fields.get("mounts", []):
        config.mounts.add(host_path=host, container_path=inside)
    for key, value in fields.get("envs", []):
        config.envs.add(key=key, value=value.encode())
    for name, _ in fields.get("cdi", []):
        config.CDI_devices.add(name=name)
    for key, value in fields.get("annotations", []):
        config.annotations[key] = value
    edits.scrub(config, managed)
    return config


@pytest.mark.parametrize(
    ("path", "canonical"),
    [
        ("/dev/./nvidia0", "/dev/nvidia0"),
        ("/dev//nvidia1", "/dev/nvidia1"),
        ("//dev/nvidia1", "/dev/nvidia1"),
        ("/run/../var/run/x", "/var/run/x"),
        ("/../../dev/nvidia0/", "/dev/nvidia0"),
        ("var/run/x", "/var/run/x"),
        ("/", "/"),
    ],
)
def test_clean_is_gos_filepath_clean(path: str, canonical: str) -> None:
    assert clean(path) == canonical


def test_the_scrub_compares_host_paths_not_container_paths() -> None:
    """host /dev/nvidia0 mapped to /dev/x is a GPU; host /dev/zero mapped to /dev/nvidia0 is not."""
    managed = ManagedDevices(patterns=("/dev/nvidia*",))
    config = scrubbed(managed, devices=[("/dev/nvidia0", "/dev/x"), ("/dev/zero", "/dev/nvidia0")])
    assert [(d.host_path, d.container_path) for d in config.devices] == [("/dev/zero", "/dev/nvidia0")]


@pytest.mark.parametrize(
    "host", ["/dev/./nvidia0", "/dev//nvidia0", "/dev/../dev/nvidia0", "//dev/nvidia0", "/dev/char/195:0"]
)
def test_spellings_of_a_managed_node_are_dropped(host: str) -> None:
    managed = ManagedDevices(numbers=frozenset({DeviceNumber(CHAR, 195, 0)}), patterns=("/dev/nvidia*",))
    assert not scrubbed(managed, devices=[(host, "/dev/x")]).devices


def test_dev_char_names_are_compared_by_number_even_where_the_link_is_missing() -> None:
    assert not os.path.exists("/dev/char/195:7")
    by_major = ManagedDevices(char_majors=frozenset({195}))
    assert not device_entry_verdict("/dev/char/195:7", by_major)
    assert device_entry_verdict("/dev/char/196:7", by_major)  # not managed, and containerd fails it
    assert not device_entry_verdict(
        "/dev/block/8:0", ManagedDevices(numbers=frozenset({DeviceNumber("b", 8, 0)}))
    )


def test_device_numbers_decide_through_symlinks_and_other_names(tmp_path: Path) -> None:
    """/dev/null's numbers stand in for a managed device: any path that reaches them is dropped."""
    link = tmp_path / "looks-harmless"
    link.symlink_to("/dev/null")
    chained = tmp_path / "chained"
    chained.symlink_to(link)
    managed = ManagedDevices(numbers=frozenset({NULL}))
    for path in (str(link), str(chained), "/dev/null", "/dev/./null"):
        assert not device_entry_verdict(path, managed), path
    assert device_entry_verdict("/dev/zero", managed)


def test_dotdot_after_a_symlink_goes_up_from_the_links_target(tmp_path: Path) -> None:
    """``<link to /dev/shm>/../null`` is /dev/null to the kernel and containerd; its lexically
    cleaned spelling ``<tmp>/null`` does not exist. /var/run is such a link on most hosts."""
    hop = tmp_path / "hop"
    hop.symlink_to("/dev/shm")
    managed = ManagedDevices(numbers=frozenset({NULL}))
    assert not device_entry_verdict(f"{hop}/../null", managed)
    assert not device_entry_verdict(f"{hop}/./../null", ManagedDevices(patterns=("/dev/null",)))
    if os.path.islink("/var/run") and os.path.realpath("/var/run") == "/run":
        assert not device_entry_verdict("/var/run/../dev/null", managed)
    assert device_entry_verdict(f"{hop}/../zero", managed)


def test_a_directory_holding_managed_nodes_is_refused_and_one_without_is_kept(tmp_path: Path) -> None:
    holder = tmp_path / "holder" / "deeper"
    holder.mkdir(parents=True)
    (holder / "null-link").symlink_to("/dev/null")  # containerd does not follow links inside a dir
    managed = ManagedDevices(numbers=frozenset({NULL}))
    assert device_entry_verdict(str(tmp_path), managed)
    with pytest.raises(Ambiguous, match="directory holding managed device nodes"):
        device_entry_verdict("/dev", managed)  # /dev/null is in it


@pytest.mark.parametrize("host", ["dev/nvidia0", "", "nvidia0", "/dev/null\x00"])
def test_relative_or_odd_device_paths_are_refused(host: str) -> None:
    with pytest.raises(Ambiguous, match="not an absolute path"):
        scrubbed(ManagedDevices(), devices=[(host, "/dev/x")])


def test_a_missing_device_is_left_to_containerd() -> None:
    assert device_entry_verdict("/dev/kubegpu-no-such-node", ManagedDevices(numbers=frozenset({NULL})))


@pytest.mark.parametrize(
    "inside",
    [
        "/var/run/nvidia-container-devices/all",
        "/var/run//nvidia-container-devices/all",
        "/var/run/./nvidia-container-devices/all",
        "/run/../var/run/nvidia-container-devices/all",
        "/var/run/nvidia-container-devicesall",
        "var/run/nvidia-container-devices/all",
        "/var/run/nvidia-container-devices/imex/0",
        "/var/run/nvidia-container-devices/cdi/nvidia.com/gpu/all",
        "/run/nvidia-container-devices/all",
        "/VAR/RUN/NVIDIA-CONTAINER-DEVICES/all",
    ],
)
def test_toolkit_device_list_mounts_are_removed_in_any_spelling(inside: str) -> None:
    config = scrubbed(ManagedDevices(), mounts=[("/dev/null", inside), ("/data", "/data")])
    assert [m.container_path for m in config.mounts] == ["/data"]


def test_toolkit_environment_is_removed_and_overridden() -> None:
    config = scrubbed(
        ManagedDevices(),
        envs=[
            ("NVIDIA_VISIBLE_DEVICES", "all"),
            ("NVIDIA_IMEX_CHANNELS", "0"),
            ("nvidia_imex_channels", "0"),
            ("NVIDIA_MOFED", "enabled"),
            ("NVIDIA_MIG_CONFIG_DEVICES", "all"),
            ("DOCKER_RESOURCE_GPU", "0"),
            ("KUBEGPU_VISIBLE_DEVICES", "x"),
            ("CUDA_VISIBLE_DEVICES", "0"),
        ],
    )
    env = [(kv.key, kv.value.decode()) for kv in config.envs]
    assert env == [("CUDA_VISIBLE_DEVICES", "0"), *edits.NEUTRAL_ENV]
    assert ("NVIDIA_IMEX_CHANNELS", "void") in env and ("NVIDIA_MOFED", "disabled") in env


@pytest.mark.parametrize("key", ["NVIDIA_VISIBLE_DEVICES=all", "A\x00B"])
def test_environment_names_containerd_would_split_are_refused(key: str) -> None:
    with pytest.raises(Ambiguous, match="environment variable"):
        scrubbed(ManagedDevices(), envs=[(key, "")])


def test_cdi_names_and_annotations_of_every_nvidia_vendor_are_removed() -> None:
    names = [
        "nvidia.com/gpu=all",
        "NVIDIA.com/gpu=0",
        " nvidia.com/gpu=0",
        "management.nvidia.com/gpu=all",
        "k8s.device-plugin.nvidia.com/gpu=GPU-1",
        "kubegpu.io/gpu=x",
        "vendor.example/fpga=0",
    ]
    config = scrubbed(
        ManagedDevices(),
        cdi=[(n, "") for n in names],
        annotations=[
            ("cdi.k8s.io/gpu", "nvidia.com/gpu=all"),
            ("nvidia.cdi.k8s.io/gpu", "nvidia.com/gpu=all"),
            ("CDI.K8S.IO/x", "nvidia.com/gpu=all"),
            ("cdi.k8s.io/mgmt", "management.nvidia.com/gpu=all,kubegpu.io/gpu=x"),
            ("Kubegpu.io/devices", "forged"),
            ("keep.me/x", "1"),
        ],
    )
    assert [c.name for c in config.CDI_devices] == ["vendor.example/fpga=0"]
    assert dict(config.annotations) == {"keep.me/x": "1"}
    with pytest.raises(Ambiguous, match="CDI device name"):
        scrubbed(ManagedDevices(), cdi=[("nvidia.com", "")])


def test_pod_annotations_that_request_cdi_devices_are_removed_from_the_request() -> None:
    sandbox = api_pb2.PodSandboxConfig()
    sandbox.annotations.update(
        {
            "cdi.k8s.io/x": "nvidia.com/gpu=all",
            "cdi.k8s.io/nic": "example.com/net=eth1",
            "kubegpu.io/allocation": "{}",
            "a": "b",
        }
    )
    edits.scrub_sandbox_annotations(sandbox)
    assert dict(sandbox.annotations) == {
        "cdi.k8s.io/nic": "example.com/net=eth1",
        "kubegpu.io/allocation": "{}",
        "a": "b",
    }
    sandbox.annotations["cdi.k8s.io/y"] = "nvidia.com/gpu=0 "
    with pytest.raises(Ambiguous, match="'cdi.k8s.io/y'"):
        edits.scrub_sandbox_annotations(sandbox)


def test_other_vendors_cdi_annotations_are_kept_and_mixed_ones_lose_only_managed_entries() -> None:
    """Another device plugin's CDI request (a NIC) is not ours to remove; an annotation naming
    devices of both is left with the other vendor's entries, in order, exactly as spelled."""
    config = scrubbed(
        ManagedDevices(),
        annotations=[
            ("cdi.k8s.io/nic", "example.com/net=eth1"),
            ("cdi.k8s.io/mixed", "example.com/net=eth1,nvidia.com/gpu=0,vendor.example/fpga=a:b"),
            ("nvidia.cdi.k8s.io/gpu", "k8s.device-plugin.nvidia.com/gpu=GPU-1,NVIDIA.COM/gpu=all"),
            ("cdi.k8s.io/ours", "kubegpu.io/gpu=x,gpu.nvidia.com/gpu=0"),
            ("cdi.k8s.io/garbage", "x"),  # containerd rejects it itself; it names nothing of ours
            ("cdi.k8s.io/garbage-and-ours", "x,nvidia.com/gpu=0,y"),
        ],
    )
    assert dict(config.annotations) == {
        "cdi.k8s.io/nic": "example.com/net=eth1",
        "cdi.k8s.io/mixed": "example.com/net=eth1,vendor.example/fpga=a:b",
        "cdi.k8s.io/garbage": "x",
        "cdi.k8s.io/garbage-and-ours": "x,y",
    }


@pytest.mark.parametrize(
    "value",
    [
        " nvidia.com/gpu=0",  # containerd does not trim: not a qualified name, a lenient reader's GPU
        "nvidia.com/gpu=0 ",
        "example.com/net=eth1, nvidia.com/gpu=all",
        "nvidia.com/gpu",
        "nvidia.com/gpu=a/b",
        "ｎｖｉｄｉａ.com/gpu=0",  # full-width letters: NFKC makes them nvidia.com
        "example.com/net=eth1;kubegpu.io/gpu=x",
        "NVIDIA.COM=gpu/0",
    ],
)
def test_a_malformed_cdi_annotation_entry_naming_a_managed_vendor_is_refused(value: str) -> None:
    with pytest.raises(Ambiguous, match="CDI annotation 'cdi.k8s.io/x'.*not a qualified CDI name"):
        scrubbed(ManagedDevices(), annotations=[("cdi.k8s.io/x", value)])


@pytest.mark.parametrize(
    ("name", "vendor"),
    [
        ("nvidia.com/gpu=0", "nvidia.com"),
        ("NVIDIA.COM/gpu=all", "NVIDIA.COM"),
        ("a/b=c", "a"),
        ("vendor.example/fpga=a:b.c-d_e", "vendor.example"),
        (" nvidia.com/gpu=0", None),
        ("nvidia.com/gpu=0 ", None),
        ("nvidia.com/gpu", None),
        ("/gpu=0", None),
        ("nvidia.com/=0", None),
        ("nvidia.com/gpu=", None),
        ("1vendor.com/gpu=0", None),
        ("vendor.com-/gpu=0", None),
        ("vendor.com/gpu/x=0", None),
        ("vendor.com/gpu=a/b", None),
        ("vendor.com/gpu=a=b", None),
        ("vendor.com/gpu=:a", None),
        ("vendor.com/gpu=a:", None),
        ("vendör.com/gpu=0", None),
        ("", None),
    ],
)
def test_qualified_cdi_names_follow_the_cdi_librarys_grammar(name: str, vendor: str | None) -> None:
    assert edits.qualified_cdi_vendor(name) == vendor


class Failing:
    """A plugin whose discovery fails (NVML not loaded yet) but whose paths are known."""

    name = "failing"
    kinds = frozenset()
    device_patterns = ("/dev/nvidia*", "/dev/null")

    def discover(self):  # type: ignore[no-untyped-def]
        from devices.plugin import PluginError

        raise PluginError("failing: NVML not available: driver not loaded")

    def health(self) -> dict[str, bool]:
        return {}

    def container_edits(self, devices, shares=None):  # type: ignore[no-untyped-def]
        raise AssertionError("never asked")


def test_well_known_paths_are_managed_before_any_device_is_discovered() -> None:
    node = NodeDevices([Failing()], sysfs_root=None)
    with pytest.raises(Exception, match="driver not loaded"):
        node.discover()
    assert not node.discovered and not node.devices
    assert NULL in node.managed.numbers  # /dev/null exists: its numbers are known
    assert not scrubbed(
        node.managed, devices=[("/dev/nvidia0", "/dev/nvidia0"), ("/dev/./null", "/dev/x")]
    ).devices


def test_the_shipped_plugins_name_their_device_nodes(tmp_path: Path) -> None:
    nvidia, rdma = load_plugins(["nvidia", "rdma"], {"sysfs_root": str(tmp_path)})
    node = NodeDevices([nvidia, rdma], sysfs_root=None)  # no discovery at all
    for path in (
        "/dev/nvidia0",
        "/dev/nvidiactl",
        "/dev/nvidia-uvm",
        "/dev/nvidia-caps/nvidia-cap1",
        "/dev/nvidia-caps-imex-channels/channel0",
        "/dev/infiniband/uverbs0",
        "/dev/infiniband/rdma_cm",
    ):
        assert node.managed.has_path(path), path
    assert node.managed.has_number(DeviceNumber(CHAR, 195, 254))
    assert node.managed.has_number(DeviceNumber(CHAR, 231, 192))
    sim = load_plugins(["sim"], {"node_name": "n", "topology": "pcie-4gpu", "state_dir": str(tmp_path / "s")})
    assert NodeDevices(sim, sysfs_root=None).managed.has_path(f"{tmp_path}/s/dev/kubegpu-sim/gpu0")


def test_a_real_device_node_under_another_name_is_caught_by_its_number(tmp_path: Path) -> None:
    alias = tmp_path / "alias"
    try:
        os.mknod(alias, stat.S_IFCHR | 0o600, os.makedev(195, 3))
    except PermissionError:
        missing_component("mknod needs root (CAP_MKNOD)")
    assert not device_entry_verdict(str(alias), ManagedDevices(char_majors=frozenset({195})))
    assert device_entry_verdict(str(alias), ManagedDevices(patterns=("/dev/nvidia*",)))  # names alone miss it


@pytest.mark.parametrize(
    ("name", "scrubbed_away"),
    [
        ("nvidia.com/gpu=GPU-1/extra", True),  # the vendor is what precedes the first slash
        ("vendor.example/fpga=a/nvidia.com", False),
        ("gpu.nvidia.com/gpu=0", True),
        ("GPU.NVIDIA.COM/gpu=0", True),
        ("nvidia.company.example/gpu=0", False),
    ],
)
def test_cdi_vendor_is_the_part_before_the_first_slash(name: str, scrubbed_away: bool) -> None:
    config = scrubbed(ManagedDevices(), cdi=[(name, "")])
    assert (not config.CDI_devices) is scrubbed_away


@pytest.mark.parametrize("name", ["nvidia.com/gpu", "/gpu=0", "  /gpu=0", "nvidia.com"])
def test_malformed_cdi_names_are_refused(name: str) -> None:
    with pytest.raises(Ambiguous, match="is not vendor/class=device"):
        scrubbed(ManagedDevices(), cdi=[(name, "")])


def test_a_directory_changing_while_it_is_walked_is_refused_not_kept(tmp_path: Path) -> None:
    """A subdirectory vanishes between listing and walking it (udev at work): the walk already
    found a managed node, so "not found" must not turn into "keep"."""
    from crishim.hostpaths import HostFS

    holder = tmp_path / "holder"
    (holder / "gone").mkdir(parents=True)
    os.symlink("/dev/null", holder / "link")  # a link is no device to containerd's walk
    managed = ManagedDevices(numbers=frozenset({NULL}))

    class Vanishing(HostFS):
        def scandir(self, path: str):  # type: ignore[no-untyped-def]
            if path.endswith("/gone"):
                raise FileNotFoundError(2, "No such file or directory", path)
            entries = list(super().scandir(path))
            null = [e for e in os.scandir("/dev") if e.name == "null"]
            return entries + null if path == str(holder) else entries

    with pytest.raises(Ambiguous):
        device_entry_verdict(str(holder), managed, Vanishing())
