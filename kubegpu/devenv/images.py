"""Build OCI image layouts around the host's static busybox, with no registry and no Docker.

The images are plain OCI layouts (index.json, oci-layout, blobs/sha256/*) written either to a
tar that ``ctr images import`` accepts or served by the local registry in ``registry.py``.
"""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from dataclasses import dataclass, field
from pathlib import Path

BUSYBOX_CANDIDATES = ("/bin/busybox", "/usr/bin/busybox")
# Applets linked into /bin so containers can run `sh -c 'env; ls -l /dev'` and friends.
BUSYBOX_APPLETS = ("sh", "env", "ls", "cat", "sleep", "echo", "true", "false", "id", "mkdir", "ps")

MEDIA_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
MEDIA_INDEX = "application/vnd.oci.image.index.v1+json"
MEDIA_CONFIG = "application/vnd.oci.image.config.v1+json"
MEDIA_LAYER = "application/vnd.oci.image.layer.v1.tar"


@dataclass(frozen=True)
class Blob:
    """A content-addressed blob of an image."""

    media_type: str
    data: bytes

    @property
    def digest(self) -> str:
        return "sha256:" + hashlib.sha256(self.data).hexdigest()

    def descriptor(self) -> dict[str, object]:
        return {"mediaType": self.media_type, "digest": self.digest, "size": len(self.data)}


@dataclass
class Image:
    """One single-platform image: a manifest, its config and one layer."""

    ref: str
    manifest: Blob
    config: Blob
    layer: Blob
    blobs: dict[str, Blob] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for blob in (self.manifest, self.config, self.layer):
            self.blobs[blob.digest] = blob


def find_busybox() -> Path:
    """Return the path of a static busybox binary on this host."""
    for candidate in BUSYBOX_CANDIDATES:
        path = Path(candidate)
        if path.is_file():
            return path
    raise FileNotFoundError("no busybox binary found (apt-get install busybox-static)")


def _layer_tar(busybox: Path) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for directory in ("bin", "dev", "proc", "sys", "tmp", "etc"):
            info = tarfile.TarInfo(directory)
            info.type = tarfile.DIRTYPE
            info.mode = 0o1777 if directory == "tmp" else 0o755
            tar.addfile(info)
        data = busybox.read_bytes()
        info = tarfile.TarInfo("bin/busybox")
        info.size = len(data)
        info.mode = 0o755
        tar.addfile(info, io.BytesIO(data))
        for applet in BUSYBOX_APPLETS:
            link = tarfile.TarInfo(f"bin/{applet}")
            link.type = tarfile.SYMTYPE
            link.linkname = "busybox"
            tar.addfile(link)
    return buf.getvalue()


def build_busybox_image(ref: str, entrypoint: list[str] | None = None) -> Image:
    """Build an amd64/linux image holding busybox, with the given default entrypoint."""
    layer = Blob(MEDIA_LAYER, _layer_tar(find_busybox()))
    config_doc = {
        "architecture": "amd64",
        "os": "linux",
        "config": {
            "Entrypoint": entrypoint or ["/bin/sh"],
            "Env": ["PATH=/bin"],
            "WorkingDir": "/",
            # Distinct per reference, so images of the same content still get distinct ids.
            "Labels": {"dev.kubegpu.image.ref": ref},
        },
        "rootfs": {"type": "layers", "diff_ids": [layer.digest]},
    }
    config = Blob(MEDIA_CONFIG, json.dumps(config_doc, sort_keys=True).encode())
    manifest_doc = {
        "schemaVersion": 2,
        "mediaType": MEDIA_MANIFEST,
        "config": config.descriptor(),
        "layers": [layer.descriptor()],
    }
    manifest = Blob(MEDIA_MANIFEST, json.dumps(manifest_doc, sort_keys=True).encode())
    return Image(ref=ref, manifest=manifest, config=config, layer=layer)


def write_oci_tar(image: Image, path: Path) -> Path:
    """Write the image as an OCI layout tar that ``ctr images import`` understands."""
    descriptor = image.manifest.descriptor()
    descriptor["annotations"] = {
        "io.containerd.image.name": image.ref,
        "org.opencontainers.image.ref.name": image.ref.rsplit(":", 1)[-1],
    }
    descriptor["platform"] = {"architecture": "amd64", "os": "linux"}
    index = {"schemaVersion": 2, "mediaType": MEDIA_INDEX, "manifests": [descriptor]}
    files: dict[str, bytes] = {
        "oci-layout": json.dumps({"imageLayoutVersion": "1.0.0"}).encode(),
        "index.json": json.dumps(index).encode(),
    }
    for digest, blob in image.blobs.items():
        files["blobs/sha256/" + digest.split(":", 1)[1]] = blob.data
    with tarfile.open(path, mode="w") as tar:
        for directory in ("blobs", "blobs/sha256"):
            info = tarfile.TarInfo(directory)
            info.type = tarfile.DIRTYPE
            info.mode = 0o755
            tar.addfile(info)
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mode = 0o644
            tar.addfile(info, io.BytesIO(data))
    return path
