"""Pure checks of the image builder's formatting (tools/image/oci.py, tools/image/build.py):
the bytes of a layer depend on the files' contents, modes and owners only."""

from __future__ import annotations

import io
import os
import re
import shutil
import subprocess
import tarfile
import time
from pathlib import Path

import pytest

from tests.fixtures.common import missing_component
from tools.image import build as image_build
from tools.image import oci


def make_tree(root: Path, mtime: float) -> None:
    (root / "usr/bin").mkdir(parents=True)
    (root / "usr/lib").mkdir(parents=True)
    (root / "b.txt").write_text("b")
    (root / "a.txt").write_text("a")
    (root / "usr/bin/tool").write_text("#!/bin/sh\n")
    (root / "usr/bin/tool").chmod(0o755)
    os.link(root / "usr/bin/tool", root / "usr/bin/tool2")
    (root / "usr/lib/link").symlink_to("../bin/tool")
    os.mkfifo(root / "fifo")
    for path in [root, *root.rglob("*")]:
        os.utime(path, (mtime, mtime), follow_symlinks=False)


def layer_bytes(root: Path, tmp: Path, name: str) -> bytes:
    store = oci.BlobStore(tmp / name)
    layer = store.add_layer(root, mtime=1_700_000_000)
    return layer.blob.path.read_bytes()


def test_layer_bytes_ignore_mtimes_and_creation_order(tmp_path: Path) -> None:
    make_tree(tmp_path / "one", time.time())
    make_tree(tmp_path / "two", 1_000)
    first = layer_bytes(tmp_path / "one", tmp_path, "s1")
    assert first == layer_bytes(tmp_path / "two", tmp_path, "s2")
    with tarfile.open(fileobj=io.BytesIO(first), mode="r:gz") as tar:
        members = tar.getmembers()
    names = [m.name for m in members]
    assert names == [
        "a.txt",
        "b.txt",
        "usr",
        "usr/bin",
        "usr/bin/tool",
        "usr/bin/tool2",
        "usr/lib",
        "usr/lib/link",
    ]
    by_name = {m.name: m for m in members}
    assert by_name["usr/bin/tool2"].islnk() and by_name["usr/bin/tool2"].linkname == "usr/bin/tool"
    assert by_name["usr/lib/link"].issym() and by_name["usr/lib/link"].linkname == "../bin/tool"
    assert by_name["usr/bin/tool"].mode == 0o755
    assert {m.mtime for m in members} == {1_700_000_000}
    assert {(m.uname, m.gname) for m in members} == {("", "")}


def test_content_change_changes_digest(tmp_path: Path) -> None:
    make_tree(tmp_path / "one", 1_000)
    make_tree(tmp_path / "two", 1_000)
    (tmp_path / "two/a.txt").write_text("A")
    assert layer_bytes(tmp_path / "one", tmp_path, "s1") != layer_bytes(tmp_path / "two", tmp_path, "s2")


def test_layout_tar_is_sorted_and_fixed(tmp_path: Path) -> None:
    make_tree(tmp_path / "root", 1_000)
    outs = []
    for n in range(2):
        layout = tmp_path / f"layout{n}"
        store = oci.BlobStore(layout)
        layer = store.add_layer(tmp_path / "root", 5)
        image_config = oci.ImageConfig(entrypoint=["x"], user="1:1", env=["A=1"], labels={"k": "v"})
        config_doc = oci.config_document(image_config, [layer], ["step"], 5)
        config = store.add_json(config_doc, oci.MEDIA_CONFIG)
        manifest = store.add_json(oci.manifest_document(config, [layer], {}), oci.MEDIA_MANIFEST)
        out = tmp_path / f"image{n}.tar"
        oci.write_layout_tar(layout, oci.index_document(manifest, "example.test/x:1"), out, 5)
        outs.append(out.read_bytes())
    assert outs[0] == outs[1]
    with tarfile.open(fileobj=io.BytesIO(outs[0])) as tar:
        names = tar.getnames()
        blobs = [n for n in names if n.startswith("blobs/sha256/")]
        assert names == ["blobs", "blobs/sha256", *sorted(blobs), "index.json", "oci-layout"]
        members = oci.read_layout_tar(tmp_path / "image0.tar")
    assert members["oci-layout"] == b'{"imageLayoutVersion":"1.0.0"}'


def test_platform_tags_cover_debian_12_glibc() -> None:
    tags = image_build.manylinux_platforms()
    assert tags[0] == "manylinux_2_36_x86_64"
    older = {"manylinux_2_17_x86_64", "manylinux2014_x86_64", "manylinux_2_28_x86_64", "manylinux1_x86_64"}
    assert older <= set(tags)
    assert "manylinux_2_37_x86_64" not in tags


def test_lock_pins_every_dependency_of_the_project() -> None:
    """Every runtime dependency in pyproject.toml is pinned (by name) in the image's lock."""
    import tomllib

    from packaging.requirements import Requirement

    with (image_build.REPO_ROOT / "pyproject.toml").open("rb") as handle:
        wanted = {
            Requirement(r).name.lower().replace("_", "-")
            for r in tomllib.load(handle)["project"]["dependencies"]
        }
    pinned = {line.split("==")[0].replace("_", "-") for line in image_build.lock_hashes().values()}
    assert wanted <= pinned
    assert "matplotlib" not in pinned


# ------------------------------------------------------------------ source and revision labels


def test_source_label_is_a_public_url_or_nothing() -> None:
    """The label names where the source is, never a placeholder, a local path or credentials."""
    cases = {
        "": None,
        "/work/main": None,
        "../kubegpu": None,
        "file:///srv/git/kubegpu.git": None,
        "https://example.invalid/kubegpu": None,
        "https://github.com/acme/kubegpu": "https://github.com/acme/kubegpu",
        "https://github.com/acme/kubegpu.git": "https://github.com/acme/kubegpu",
        "https://ci:ghp_s3cr3t@github.com/acme/kubegpu.git": "https://github.com/acme/kubegpu",
        "http://user@git.acme.dev:8080/acme/kubegpu": "http://git.acme.dev:8080/acme/kubegpu",
        "https://git.example.org/acme/kubegpu": None,
        "https://github.com": None,
        "git@github.com:acme/kubegpu.git": "https://github.com/acme/kubegpu",
        "ssh://git@gitlab.acme.dev:2222/acme/kubegpu.git": "https://gitlab.acme.dev/acme/kubegpu",
    }
    for remote, label in cases.items():
        assert image_build.source_url(remote) == label, remote


def test_unknown_source_and_revision_are_left_out() -> None:
    opts = image_build.Options(
        out=Path("/nonexistent.tar"), ref="r", epoch=0, source=None, revision=None, cache=Path("/c")
    )
    labels = image_build.labels(opts, "0.1.0", ["python3=3.11"])
    assert "org.opencontainers.image.source" not in labels
    assert "org.opencontainers.image.revision" not in labels
    assert labels["org.opencontainers.image.version"] == "0.1.0"
    assert not [value for value in labels.values() if "invalid" in value or value in ("", "unknown")]


def test_revision_only_for_a_clean_tree(tmp_path: Path) -> None:
    """The wheel is built from the working tree: a tracked file changed since HEAD means the
    image is not that commit, so it gets no revision label."""
    repo = tmp_path / "repo"
    repo.mkdir()
    env = {**os.environ, "GIT_CONFIG_GLOBAL": "/dev/null", "GIT_CONFIG_SYSTEM": "/dev/null"}

    def git(*args: str) -> str:
        return subprocess.run(
            ["git", "-C", str(repo), *args], check=True, capture_output=True, text=True, env=env
        ).stdout.strip()

    git("init", "-q")
    (repo / "a.py").write_text("a = 1\n")
    git("add", "a.py")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "one")
    head = git("rev-parse", "HEAD")
    assert image_build.git_revision(repo) == head
    (repo / "untracked.txt").write_text("not in the wheel\n")
    assert image_build.git_revision(repo) == head
    (repo / "a.py").write_text("a = 2\n")
    assert image_build.git_revision(repo) is None
    assert image_build.git_revision(tmp_path / "not-a-repo") is None


def tiny_wheel(directory: Path) -> Path:
    """A minimal pure-Python wheel with a package, a data file and a console script."""
    import zipfile

    path = directory / "tiny-1.0-py3-none-any.whl"
    files = {
        "tiny/__init__.py": "def main():\n    return 0\n",
        "tiny/data/table.json": "{}\n",
        "tiny-1.0.dist-info/METADATA": "Metadata-Version: 2.1\nName: tiny\nVersion: 1.0\n",
        "tiny-1.0.dist-info/WHEEL": (
            "Wheel-Version: 1.0\nGenerator: hand\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        ),
        "tiny-1.0.dist-info/entry_points.txt": "[console_scripts]\ntiny = tiny:main\n",
    }
    record = "".join(f"{name},,\n" for name in files) + "tiny-1.0.dist-info/RECORD,,\n"
    with zipfile.ZipFile(path, "w") as archive:
        for name, text in {**files, "tiny-1.0.dist-info/RECORD": record}.items():
            archive.writestr(name, text)
    return path


def test_layer_bytes_do_not_depend_on_the_builders_umask(tmp_path: Path) -> None:
    """Same inputs, same digest: a builder with umask 0002 (many desktops) and one with 0022 (CI)
    must write the same layer; the installed files' modes came from the umask."""
    wheel = tiny_wheel(tmp_path)
    layers = []
    for umask in (0o022, 0o002, 0o077):
        dest = tmp_path / f"umask-{umask:o}"
        dest.mkdir()
        old = os.umask(umask)
        try:
            image_build.install_wheels([wheel], dest)
        finally:
            os.umask(old)
        layers.append(layer_bytes(dest, tmp_path, f"store-{umask:o}"))
    assert layers[0] == layers[1] == layers[2]
    with tarfile.open(fileobj=io.BytesIO(layers[0]), mode="r:gz") as tar:
        modes = {m.name: m.mode for m in tar.getmembers()}
    site = image_build.SITE_PACKAGES.lstrip("/")
    assert modes[f"{site}/tiny/__init__.py"] == 0o644
    assert modes[f"{site}/tiny"] == 0o755
    assert modes["usr/local/bin/tiny"] == 0o755


# ------------------------------------------------------------------- the Debian packages, pinned


def tiny_deb(directory: Path, name: str, version: str) -> Path:
    """A .deb of one small file, built by dpkg-deb (no root needed)."""
    if shutil.which("dpkg-deb") is None:
        missing_component("dpkg-deb not found (the image build needs it)")
    tree = directory / f"{name}-{version}-tree"
    (tree / "DEBIAN").mkdir(parents=True)
    (tree / "DEBIAN/control").write_text(
        f"Package: {name}\nVersion: {version}\nArchitecture: all\nMaintainer: t <t@t>\n"
        f"Description: {name} for a test\n two lines\n"
    )
    (tree / "usr/share").mkdir(parents=True)
    (tree / "usr/share" / name).write_text(f"{name} {version}\n")
    out = directory / f"{name}_{version}_all.deb"
    subprocess.run(["dpkg-deb", "--root-owner-group", "--build", str(tree), str(out)], check=True,
                   capture_output=True)  # fmt: skip
    return out


def test_pinned_build_must_use_exactly_the_given_packages() -> None:
    """A build given .deb files is that earlier build only if it used exactly them: an unused one
    (say the mirror's older version beside the newer) is as wrong as an extra one."""
    given = ["libc6=2.36-9+deb12u14", "libzstd1=1.5.4+dfsg2-5+deb12u1"]
    assert image_build.pinned_mismatch(given, list(reversed(given))) is None
    older = ["libc6=2.36-9+deb12u14", "libzstd1=1.5.4+dfsg2-5"]
    assert image_build.pinned_mismatch(given, older) == (
        "given but not used: libzstd1=1.5.4+dfsg2-5+deb12u1; used but not given: libzstd1=1.5.4+dfsg2-5"
    )
    assert image_build.pinned_mismatch([*given, "zlib1g=1:1.2.13.dfsg-1"], given) == (
        "given but not used: zlib1g=1:1.2.13.dfsg-1"
    )


def test_kept_debs_are_addressed_by_content(tmp_path: Path) -> None:
    """The .deb files a build used are kept in the cache under their sha256, so a later build can
    be given exactly them; a file of the same name with other bytes never replaces one."""
    first, second = tmp_path / "a", tmp_path / "b"
    first.mkdir()
    second.mkdir()
    (first / "libzstd1_1.5.4_amd64.deb").write_bytes(b"one")
    (first / "dpkg_1.21_amd64.deb").write_bytes(b"two")
    (second / "libzstd1_1.5.4_amd64.deb").write_bytes(b"another")
    store = tmp_path / "cache" / "debs"
    kept = image_build.keep_debs(sorted(first.iterdir()), store)
    assert [path.name for path in kept] == ["dpkg_1.21_amd64.deb", "libzstd1_1.5.4_amd64.deb"]
    for path in kept:
        assert path.parent.name == image_build.sha256_hex(path)
        assert path.read_bytes() == (first / path.name).read_bytes()
    inode = kept[1].stat().st_ino
    assert image_build.keep_debs(sorted(first.iterdir()), store) == kept
    assert kept[1].stat().st_ino == inode  # kept once, not copied again
    (other,) = image_build.keep_debs([second / "libzstd1_1.5.4_amd64.deb"], store)
    assert other != kept[1] and other.read_bytes() == b"another" and kept[1].read_bytes() == b"one"
    assert not [path for path in store.rglob("*") if path.name.endswith(".partial")]


def test_local_repository_indexes_exactly_the_given_debs(tmp_path: Path) -> None:
    """The repository a pinned build resolves from: the given files and a Packages index of their
    control fields, file names, sizes and sha256 (which apt checks), and nothing else."""
    debs = [tiny_deb(tmp_path, "beta", "2.0-1"), tiny_deb(tmp_path, "alpha", "1:1.0-1")]
    repo = tmp_path / "repo"
    line = image_build.local_repository(debs, repo)
    assert line == f"deb [trusted=yes] copy://{repo} ./"
    assert sorted(path.name for path in repo.iterdir()) == sorted([deb.name for deb in debs] + ["Packages"])
    stanzas = [
        dict(re.findall(r"^(\S+): (.*)$", text, re.M))
        for text in (repo / "Packages").read_text().split("\n\n")
    ]
    assert [(s["Package"], s["Version"]) for s in stanzas] == [("alpha", "1:1.0-1"), ("beta", "2.0-1")]
    for stanza, deb in zip(stanzas, sorted(debs, key=lambda path: path.name), strict=True):
        assert stanza["Filename"] == f"./{deb.name}"
        assert int(stanza["Size"]) == deb.stat().st_size
        assert stanza["SHA256"] == image_build.sha256_hex(deb)
    with pytest.raises(image_build.BuildError, match="two .deb files named"):
        image_build.local_repository([debs[0], debs[0]], tmp_path / "repo2")
