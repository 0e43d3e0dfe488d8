"""Reproducible OCI image pieces: layer tars from directories, config, manifest, layout tar.

Pure file formatting, no policy: every entry of every tar is written in sorted order with a
fixed mtime, no user or group names, and gzip headers without a name or time, so the same
directory contents give the same bytes (and so the same digests) on every build.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import stat
import tarfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

MEDIA_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
MEDIA_INDEX = "application/vnd.oci.image.index.v1+json"
MEDIA_CONFIG = "application/vnd.oci.image.config.v1+json"
MEDIA_LAYER_GZIP = "application/vnd.oci.image.layer.v1.tar+gzip"
CHUNK = 1 << 20


@dataclass(frozen=True)
class BlobFile:
    """A content-addressed blob stored in a file."""

    path: Path
    media_type: str
    digest: str
    size: int

    def descriptor(self) -> dict[str, object]:
        return {"mediaType": self.media_type, "digest": self.digest, "size": self.size}


@dataclass(frozen=True)
class Layer:
    """A compressed layer blob and the digest of its uncompressed tar (the config's diff_id)."""

    blob: BlobFile
    diff_id: str
    uncompressed_size: int


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(CHUNK):
            digest.update(chunk)
    return "sha256:" + digest.hexdigest()


def walk_sorted(root: Path) -> Iterator[Path]:
    """Every path under ``root`` (not ``root`` itself), parents before children, names sorted
    bytewise; symlinks to directories are listed, never followed."""
    names = sorted(os.listdir(root), key=os.fsencode)
    for name in names:
        path = root / name
        yield path
        if path.is_dir() and not path.is_symlink():
            yield from walk_sorted(path)


def tar_entries(root: Path) -> Iterator[tuple[str, Path]]:
    """(name in the layer, path on disk) for the files a layer of ``root`` holds.

    Device nodes, sockets and FIFOs are left out: the runtime provides /dev."""
    for path in walk_sorted(root):
        mode = path.lstat().st_mode
        if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) or stat.S_ISSOCK(mode) or stat.S_ISFIFO(mode):
            continue
        yield path.relative_to(root).as_posix(), path


def write_layer_tar(root: Path, out: Path, mtime: int) -> None:
    """Write the uncompressed layer tar of directory ``root``: sorted, every mtime ``mtime``,
    numeric owners only, hard links kept as hard links."""
    with tarfile.open(out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, path in tar_entries(root):
            info = tar.gettarinfo(str(path), arcname=name)
            info.mtime = mtime
            info.uname = info.gname = ""
            if info.isreg():
                with path.open("rb") as handle:
                    tar.addfile(info, handle)
            else:
                tar.addfile(info)


def gzip_file(src: Path, dest: Path) -> None:
    """gzip with no file name and a zero time in the header (bytes depend on content only)."""
    with src.open("rb") as raw, dest.open("wb") as handle:
        with gzip.GzipFile(filename="", mode="wb", fileobj=handle, mtime=0, compresslevel=9) as out:
            while chunk := raw.read(CHUNK):
                out.write(chunk)


class BlobStore:
    """The blobs/sha256 directory of an OCI layout under construction."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory / "blobs" / "sha256"
        self.directory.mkdir(parents=True, exist_ok=True)

    def add_file(self, path: Path, media_type: str) -> BlobFile:
        """Move ``path`` into the store under its digest."""
        digest = sha256_file(path)
        target = self.directory / digest.split(":", 1)[1]
        os.replace(path, target)
        return BlobFile(target, media_type, digest, target.stat().st_size)

    def add_bytes(self, data: bytes, media_type: str) -> BlobFile:
        digest = "sha256:" + hashlib.sha256(data).hexdigest()
        target = self.directory / digest.split(":", 1)[1]
        target.write_bytes(data)
        return BlobFile(target, media_type, digest, len(data))

    def add_json(self, document: object, media_type: str) -> BlobFile:
        return self.add_bytes(canonical_json(document), media_type)

    def add_layer(self, root: Path, mtime: int) -> Layer:
        """Tar and gzip directory ``root`` into a layer blob."""
        plain = self.directory.parent / "layer.tar"
        packed = self.directory.parent / "layer.tar.gz"
        write_layer_tar(root, plain, mtime)
        diff_id, size = sha256_file(plain), plain.stat().st_size
        gzip_file(plain, packed)
        plain.unlink()
        return Layer(self.add_file(packed, MEDIA_LAYER_GZIP), diff_id, size)


def canonical_json(document: object) -> bytes:
    return json.dumps(document, sort_keys=True, separators=(",", ":")).encode()


def rfc3339(epoch: int) -> str:
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True)
class ImageConfig:
    """What the image runs and says about itself (the OCI config's ``config`` object)."""

    entrypoint: Sequence[str]
    user: str
    env: Sequence[str]
    labels: Mapping[str, str]
    working_dir: str = "/"
    cmd: Sequence[str] = ()


def config_document(
    config: ImageConfig, layers: Sequence[Layer], history: Sequence[str], created: int
) -> dict[str, object]:
    """The OCI image config (architecture amd64, linux), one history entry per layer."""
    body: dict[str, object] = {
        "Entrypoint": list(config.entrypoint),
        "User": config.user,
        "Env": list(config.env),
        "WorkingDir": config.working_dir,
        "Labels": dict(config.labels),
    }
    if config.cmd:
        body["Cmd"] = list(config.cmd)
    return {
        "architecture": "amd64",
        "os": "linux",
        "created": rfc3339(created),
        "config": body,
        "rootfs": {"type": "layers", "diff_ids": [layer.diff_id for layer in layers]},
        "history": [{"created": rfc3339(created), "created_by": step} for step in history],
    }


def manifest_document(config: BlobFile, layers: Sequence[Layer], annotations: Mapping[str, str]) -> dict:
    return {
        "schemaVersion": 2,
        "mediaType": MEDIA_MANIFEST,
        "config": config.descriptor(),
        "layers": [layer.blob.descriptor() for layer in layers],
        "annotations": dict(annotations),
    }


def index_document(manifest: BlobFile, ref: str) -> dict:
    """The layout's index.json naming the one manifest ``ref`` (ctr import reads both names)."""
    name = ref.rsplit("/", 1)[-1]
    tag = name.rsplit(":", 1)[-1] if ":" in name else "latest"
    descriptor = manifest.descriptor()
    descriptor["platform"] = {"architecture": "amd64", "os": "linux"}
    descriptor["annotations"] = {
        "io.containerd.image.name": ref,
        "org.opencontainers.image.ref.name": tag,
    }
    return {"schemaVersion": 2, "mediaType": MEDIA_INDEX, "manifests": [descriptor]}


def write_layout_tar(layout: Path, index: dict, out: Path, mtime: int) -> None:
    """Write the OCI layout directory ``layout`` (its blobs) plus ``index`` as one sorted tar."""
    (layout / "oci-layout").write_bytes(canonical_json({"imageLayoutVersion": "1.0.0"}))
    (layout / "index.json").write_bytes(canonical_json(index))
    with tarfile.open(out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, path in tar_entries(layout):
            if path.is_dir():
                info = tarfile.TarInfo(name)
                info.type, info.mode = tarfile.DIRTYPE, 0o755
                tar.addfile(_fixed(info, mtime))
                continue
            info = tarfile.TarInfo(name)
            info.size, info.mode = path.stat().st_size, 0o644
            with path.open("rb") as handle:
                tar.addfile(_fixed(info, mtime), handle)


def _fixed(info: tarfile.TarInfo, mtime: int) -> tarfile.TarInfo:
    info.mtime, info.uid, info.gid, info.uname, info.gname = mtime, 0, 0, "", ""
    return info


def read_layout_tar(path: Path) -> dict[str, bytes]:
    """The small JSON members of an image tar (index, manifests, configs), for checks and tests."""
    members: dict[str, bytes] = {}
    with tarfile.open(path) as tar:
        for info in tar:
            if info.isreg() and info.size < (1 << 20):
                handle = tar.extractfile(info)
                assert handle is not None
                members[info.name] = handle.read()
    return members


def blob_text(members: Mapping[str, bytes], digest: str) -> dict:
    return json.loads(members["blobs/sha256/" + digest.split(":", 1)[1]])


def layer_names(layer_tar_gz: bytes) -> list[str]:
    with tarfile.open(fileobj=io.BytesIO(layer_tar_gz), mode="r:gz") as tar:
        return tar.getnames()
