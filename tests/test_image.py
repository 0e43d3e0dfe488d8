"""The scheduler image that ``make image`` builds (tools/image/build.py), run through containerd.

The image is built once per session (tests/fixtures/image.py), imported into the private
containerd 1.6 and run as kubelet would run it: its own entry point and user, a read-only root
filesystem. A second build from the same inputs must give the same digest.
"""

from __future__ import annotations

import json
import re
import shlex
import tarfile
import uuid
from pathlib import Path
from typing import Any

import pytest

from crishim.cri import api_pb2
from kubegpu import __version__
from kubegpu.devenv.containerd import Containerd
from kubegpu.devenv.cri import CriClient, host_network_sandbox
from tests.fixtures.image import build_image
from tests.support.waiting import wait_for
from tools.image import build as image_build
from tools.image import oci

REPO_ROOT = Path(__file__).resolve().parents[1]


def image_members(image: dict[str, Any]) -> tuple[dict, dict, list[Path]]:
    """(manifest, config, layer blob paths) of the built image tar."""
    members = oci.read_layout_tar(Path(image["tar"]))
    index = json.loads(members["index.json"])
    manifest = oci.blob_text(members, index["manifests"][0]["digest"])
    config = oci.blob_text(members, manifest["config"]["digest"])
    return manifest, config, [layer["digest"] for layer in manifest["layers"]]


def layer_files(image: dict[str, Any]) -> dict[str, tarfile.TarInfo]:
    """Every entry of every layer, by path (the later layer wins, as in an unpacked image)."""
    entries: dict[str, tarfile.TarInfo] = {}
    with tarfile.open(image["tar"]) as outer:
        for layer in image["layers"]:
            blob = outer.extractfile("blobs/sha256/" + layer["digest"].split(":", 1)[1])
            assert blob is not None
            with tarfile.open(fileobj=blob, mode="r:gz") as inner:
                for info in inner:
                    entries[info.name] = info
    return entries


# ------------------------------------------------------------------------------ the image itself


def test_config_user_entrypoint_labels(kubegpu_image: dict[str, Any]) -> None:
    manifest, config, _ = image_members(kubegpu_image)
    body = config["config"]
    assert body["User"] == "65532:65532"
    assert body["Entrypoint"] == ["kubegpu"]
    assert "PYTHONDONTWRITEBYTECODE=1" in body["Env"]
    labels = body["Labels"]
    assert labels["org.opencontainers.image.version"] == __version__
    # source and revision unknown here: left out, never a placeholder (tests/test_image_oci.py)
    assert "org.opencontainers.image.source" not in labels
    assert "org.opencontainers.image.revision" not in labels
    assert "org.opencontainers.image.source" not in manifest["annotations"]
    assert labels["org.opencontainers.image.title"] == "kubegpu"
    assert re.search(r"\bpython3\.11=3\.11\.\d", labels["dev.kubegpu.image.debian-packages"])
    assert manifest["annotations"]["org.opencontainers.image.version"] == __version__
    assert len(config["rootfs"]["diff_ids"]) == len(manifest["layers"]) == 2
    assert config["created"] == oci.rfc3339(kubegpu_image["source_date_epoch"])


def test_contents_are_slim(kubegpu_image: dict[str, Any]) -> None:
    """No pip, bytecode, docs beyond copyright files, apt lists, device nodes or host files."""
    entries = layer_files(kubegpu_image)
    names = set(entries)
    site = image_build.SITE_PACKAGES.lstrip("/")
    assert f"{site}/kubegpu/cli.py" in names
    assert f"{site}/crishim/cri/api_pb2.py" in names  # the generated stubs are in the wheel
    assert "usr/local/bin/kubegpu" in names
    assert "usr/bin/python3.11" in names
    assert not [n for n in names if n.endswith(".pyc") or "__pycache__" in n]
    assert not [n for n in names if re.search(r"(^|/)pip(/|-\d)", n)]
    assert not [
        n
        for n in names
        if n.startswith("usr/share/doc/") and entries[n].isreg() and not n.endswith("/copyright")
    ]
    assert not [n for n in names if n.startswith(("var/lib/apt/", "var/cache/", "usr/share/man/", "dev/"))]
    assert not {"etc/resolv.conf", "etc/hostname", "etc/hosts"} & names
    assert not [n for n in names if n.startswith(f"{site}/numpy/") and "/tests/" in n]
    assert not [n for n in names if n.startswith(f"{site}/matplotlib")]
    assert all(info.mtime == kubegpu_image["source_date_epoch"] for info in entries.values())
    assert entries["tmp"].mode == 0o1777
    assert (entries["home/nonroot"].uid, entries["home/nonroot"].gid) == (65532, 65532)
    status = entries["var/lib/dpkg/status"]
    assert status.isreg() and status.size > 0
    mib = 1 << 20
    print(
        f"image: {kubegpu_image['compressed_bytes'] / mib:.1f} MiB compressed, "
        f"{kubegpu_image['uncompressed_bytes'] / mib:.1f} MiB unpacked"
    )


def test_same_inputs_same_digest(kubegpu_image: dict[str, Any], tmp_path: Path) -> None:
    """Built again from the same inputs, the image is the same to the byte. The Debian packages
    are an input the mirrors change whenever Debian publishes (once the session's first build got
    libzstd1 1.5.4+dfsg2-5 and this one, 90 s later, the security update +deb12u1: another
    digest), so this build is given the first one's .deb files and may not ask the mirrors, which
    are made unreachable here. Everything else is built again."""
    again = build_image(
        tmp_path / "again.oci.tar",
        debs=kubegpu_image["debs"],
        mirror="http://deb.debian.invalid/debian",
        security_mirror="http://security.debian.invalid/debian-security",
    )
    assert again["debian_packages"] == kubegpu_image["debian_packages"]
    assert again["layers"] == kubegpu_image["layers"]
    assert again["digest"] == kubegpu_image["digest"]
    assert Path(again["tar"]).read_bytes() == Path(kubegpu_image["tar"]).read_bytes()


def test_dockerfile_matches_the_built_image(kubegpu_image: dict[str, Any]) -> None:
    """The Dockerfile (for users with a registry) says what `make image` builds: user, entry
    point, environment, the OCI labels, the lock file it installs, the Python line."""
    _, config, _ = image_members(kubegpu_image)
    text = (REPO_ROOT / "Dockerfile").read_text()
    instructions = [
        " ".join(line.split())
        for line in re.sub(r"\\\n", " ", text).splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    ]
    final = instructions[max(i for i, line in enumerate(instructions) if line.startswith("FROM "))]
    assert final == "FROM ${PYTHON_IMAGE}"
    assert "ARG PYTHON_IMAGE=python:3.11-slim-bookworm" in instructions
    assert f"USER {config['config']['User']}" in instructions
    assert f"ENTRYPOINT {json.dumps(config['config']['Entrypoint'])}" in instructions
    env_line = next(line for line in instructions if line.startswith("ENV "))
    image_env = [e for e in config["config"]["Env"] if not e.startswith("PATH=")]
    assert sorted(env_line.split()[1:]) == sorted(image_env)
    label_line = next(line for line in instructions if line.startswith("LABEL "))
    docker_labels = dict(
        (key, value) for key, value in (item.split("=", 1) for item in shlex.split(label_line)[1:])
    )
    labels = config["config"]["Labels"]
    image_labels = {k: v for k, v in labels.items() if k.startswith("org.opencontainers.")}
    assert set(docker_labels) == set(image_labels) - {"org.opencontainers.image.base.name"}
    # source and revision come from `docker build --label` when known, never from a default
    assert "invalid" not in text and "REVISION=unknown" not in text
    assert docker_labels["org.opencontainers.image.version"] == "${VERSION}"
    assert f"ARG VERSION={__version__}" in instructions
    assert (
        docker_labels["org.opencontainers.image.description"]
        == image_labels["org.opencontainers.image.description"]
    )
    assert "COPY tools/image/requirements.lock /tmp/requirements.lock" in instructions
    assert any("--require-hashes -r /tmp/requirements.lock" in line for line in instructions)
    assert any("pip uninstall" in line for line in instructions)
    assert any("--uid 65532" in line for line in instructions)


# ------------------------------------------------------------------------ run through containerd


@pytest.fixture(scope="module")
def imported_image(kubegpu_image: dict[str, Any], containerd: Containerd) -> str:
    """The image imported into the session containerd 1.6 (k8s.io namespace); its ref."""
    # what `make image` runs when containerd's socket exists
    image_build.import_into_containerd(Path(kubegpu_image["tar"]), str(containerd.socket), ctr=containerd.ctr)
    listing = containerd.run_ctr("images", "ls")
    line = next(line for line in listing.splitlines() if line.startswith(kubegpu_image["ref"] + " "))
    assert kubegpu_image["digest"] in line
    return kubegpu_image["ref"]


def run_in_image(
    client: CriClient, image: str, tmp_path: Path, args: list[str], command: list[str] | None = None
) -> tuple[int, str]:
    """Run one container of ``image`` to completion as kubelet would, with a read-only root
    filesystem and the image's own user; return (exit code, its output)."""
    name = f"img-{uuid.uuid4().hex[:6]}"
    log_dir = tmp_path / name
    log_dir.mkdir()
    sandbox = host_network_sandbox(name, str(uuid.uuid4()), log_directory=str(log_dir))
    started = client.runtime.RunPodSandbox(api_pb2.RunPodSandboxRequest(config=sandbox), timeout=60)
    sandbox_id = started.pod_sandbox_id
    try:
        config = api_pb2.ContainerConfig(
            metadata=api_pb2.ContainerMetadata(name="main", attempt=0),
            image=api_pb2.ImageSpec(image=image),
            command=command or [],
            args=args,
            log_path="main.log",
            linux=api_pb2.LinuxContainerConfig(
                security_context=api_pb2.LinuxContainerSecurityContext(readonly_rootfs=True)
            ),
        )
        container_id = client.runtime.CreateContainer(
            api_pb2.CreateContainerRequest(pod_sandbox_id=sandbox_id, config=config, sandbox_config=sandbox),
            timeout=60,
        ).container_id
        client.runtime.StartContainer(api_pb2.StartContainerRequest(container_id=container_id), timeout=60)

        def status() -> api_pb2.ContainerStatus:
            return client.runtime.ContainerStatus(
                api_pb2.ContainerStatusRequest(container_id=container_id), timeout=10
            ).status

        wait_for(lambda: status().state == api_pb2.CONTAINER_EXITED, timeout=60)
        lines = (log_dir / "main.log").read_text().splitlines()
        # CRI log format: "<time> <stream> <P|F> <text>"
        return status().exit_code, "\n".join(line.split(" ", 3)[3] for line in lines)
    finally:
        client.runtime.StopPodSandbox(api_pb2.StopPodSandboxRequest(pod_sandbox_id=sandbox_id), timeout=60)
        client.runtime.RemovePodSandbox(
            api_pb2.RemovePodSandboxRequest(pod_sandbox_id=sandbox_id), timeout=60
        )


@pytest.mark.containerd
def test_version_through_containerd(direct: CriClient, imported_image: str, tmp_path: Path) -> None:
    code, out = run_in_image(direct, imported_image, tmp_path, ["--version"])
    assert (code, out.strip()) == (0, f"kubegpu {__version__}")


@pytest.mark.containerd
def test_scheduler_help_through_containerd(direct: CriClient, imported_image: str, tmp_path: Path) -> None:
    code, out = run_in_image(direct, imported_image, tmp_path, ["scheduler", "--help"])
    assert code == 0, out
    assert out.startswith("usage: kubegpu scheduler")
    for flag in ("--config", "--kubeconfig", "--leader-elect", "--keys-dir"):
        assert flag in out


@pytest.mark.containerd
def test_runs_as_65532_on_a_read_only_root(direct: CriClient, imported_image: str, tmp_path: Path) -> None:
    probe = (
        "import os, errno, kubernetes, grpc, numpy, uvloop, yaml\n"
        "print(os.getuid(), os.getgid(), os.environ['HOME'])\n"
        "for path in ('/usr/probe', '/tmp/probe'):\n"
        "    try:\n        open(path, 'w')\n"
        "    except OSError as e:\n        print(errno.errorcode[e.errno])\n"
    )
    code, out = run_in_image(direct, imported_image, tmp_path, ["-c", probe], command=["python3"])
    assert code == 0, out
    assert out.split("\n") == ["65532 65532 /home/nonroot", "EROFS", "EROFS"]


@pytest.mark.containerd
@pytest.mark.parametrize(
    "args, expected",
    [
        (["crishim", "--help"], "usage: kubegpu crishim"),
        (["node", "check", "--help"], "usage: kubegpu node check"),
        (["keys", "generate"], "-----BEGIN PRIVATE KEY-----"),  # cryptography's native code runs
    ],
    ids=["crishim", "node-check", "keys-generate"],
)
def test_other_subcommands_through_containerd(
    direct: CriClient, imported_image: str, tmp_path: Path, args: list[str], expected: str
) -> None:
    """The entry point serves the node agent's and the operator's commands too, on a read-only
    root as the image's user (their imports: grpc, the CRI stubs, cryptography)."""
    code, out = run_in_image(direct, imported_image, tmp_path, args)
    assert code == 0, out
    assert out.startswith(expected), out
