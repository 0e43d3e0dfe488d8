"""Build the kubegpu image with no container registry: ``python -m tools.image.build`` (``make image``).

The image is what the repository's Dockerfile describes (a slim Python 3.11, the project installed
as a wheel, uid 65532, ``kubegpu`` as the entry point, OCI labels), made from parts that are
reachable without a registry:

1. the root filesystem: Debian 12 packages (``python3``, ``libstdc++6`` and their dependencies)
   unpacked by ``mmdebstrap --variant=extract`` (no maintainer scripts run), pruned of
   documentation (copyright files stay), apt and dpkg state, /dev and host files; a dpkg status
   file lists the packages so image scanners see them;
2. the project's dependencies: the wheels pinned with their hashes in
   ``tools/image/requirements.lock``, downloaded once into ``~/.cache/kubegpu/image/wheels``;
3. the project: a wheel built from the git-tracked files plus the generated CRI stubs.

Wheels are installed with ``installer`` (no pip in the image) into Debian's
``/usr/local/lib/python3.11/dist-packages``, less the packages' own test suites. No bytecode is
shipped: it would add ~40% to the image and save about 0.3 s per process start (docs/install.md).
Layer 1 holds (1) and (2), layer 2 holds (3), so a new kubegpu version changes one small layer.

Reproducible: every tar entry is sorted with a fixed mtime (SOURCE_DATE_EPOCH, default the commit
time of HEAD), gzip headers carry no name or time, JSON is canonical. The same Debian package
versions, lock file, sources and labels give the same image digest. The mirrors move on (security
updates), so the .deb files a build used are kept in the cache (``debs/<sha256>/``) and listed in
its result; ``Options.debs`` builds from exactly those again, without asking a mirror.
Needs root (mmdebstrap's root mode) and network access to Debian's and PyPI's servers.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import tomllib
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from tools.image import oci

REPO_ROOT = Path(__file__).resolve().parents[2]
LOCK_FILE = Path(__file__).with_name("requirements.lock")
PYTHON_VERSION = "3.11"
SITE_PACKAGES = f"/usr/local/lib/python{PYTHON_VERSION}/dist-packages"
INTERPRETER = "/usr/bin/python3"
DEBIAN_SUITE = "bookworm"
DEBIAN_MIRROR = "http://deb.debian.org/debian"
DEBIAN_SECURITY = "http://deb.debian.org/debian-security"
DEBIAN_PACKAGES = ("python3", "libstdc++6")
# glibc 2.36 (Debian 12): wheels for any manylinux tag up to 2.36 run in the image.
GLIBC_MINOR = 36
UID = GID = 65532
UMASK = 0o022
USER_NAME = "nonroot"
PATH_ENV = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
ENV = (PATH_ENV, "PYTHONDONTWRITEBYTECODE=1", "PYTHONUNBUFFERED=1")
GENERATED = (
    "crishim/cri/api_pb2.py",
    "crishim/cri/api_pb2_grpc.py",
    "crishim/nri/api_pb2.py",
    "crishim/nri/ttrpc_pb2.py",
)
DEFAULT_REF = "docker.io/library/kubegpu:{version}"
DESCRIPTION = "kubegpu: topology-aware device scheduler, CRI shim and node agent"
# Hosts that are placeholders, never a real source (RFC 2606 / RFC 6761).
PLACEHOLDER_HOSTS = re.compile(r"(^|\.)(invalid|example|test|localhost|example\.(com|net|org))$")

# Removed from the Debian tree: documentation (not the copyright files), package manager state
# and caches, device nodes (the runtime provides /dev) and files mmdebstrap copies from the host.
PRUNE = (
    "usr/share/man",
    "usr/share/info",
    "usr/share/locale",
    "usr/share/lintian",
    "usr/share/bug",
    "usr/share/menu",
    "usr/share/common-licenses",
    "var/cache",
    "var/lib/apt",
    "var/log",
    "etc/apt",
    "etc/hostname",
    "etc/resolv.conf",
    "etc/hosts",
    "etc/machine-id",
    "etc/mtab",
    "dev",
)


class BuildError(RuntimeError):
    """A step of the image build failed; the message says which and why."""


@dataclass(frozen=True)
class Options:
    out: Path
    ref: str
    epoch: int
    source: str | None  # None: unknown, no label (never a placeholder)
    revision: str | None  # None: not a clean commit, no label
    cache: Path
    mirror: str = DEBIAN_MIRROR
    security_mirror: str = DEBIAN_SECURITY
    # Empty: resolve the Debian packages from the mirrors (their current versions). Else exactly
    # these .deb files (a build's "debs"), served from a local repository: the mirrors are not asked.
    debs: tuple[Path, ...] = ()


def run(cmd: Sequence[str | os.PathLike[str]], **kwargs: object) -> subprocess.CompletedProcess[str]:
    """Run a command; on failure raise BuildError with its output tail."""
    result = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, **kwargs)  # type: ignore[call-overload]
    if result.returncode != 0:
        tail = "\n".join((result.stdout + result.stderr).splitlines()[-30:])
        raise BuildError(f"{Path(str(cmd[0])).name} failed (exit {result.returncode}):\n{tail}")
    return result


def project_version() -> str:
    with (REPO_ROOT / "pyproject.toml").open("rb") as handle:
        return str(tomllib.load(handle)["project"]["version"])


def git(*args: str) -> str:
    result = subprocess.run(["git", "-C", str(REPO_ROOT), *args], capture_output=True, text=True)
    return result.stdout.strip() if result.returncode == 0 else ""


def source_url(remote: str) -> str | None:
    """The public URL of a git remote for ``org.opencontainers.image.source``: http(s) and the
    ssh spellings (``git@host:path``, ``ssh://``) become ``https://host/path`` without ``.git``;
    user names and tokens are dropped (a label is public). None for a local path, ``file://``,
    a placeholder host or nothing: the label is then left out rather than made up."""
    from urllib.parse import urlsplit

    remote = remote.strip()
    scp = re.fullmatch(r"[\w.-]+@([\w.-]+):(?!//)(.+)", remote)
    if scp:
        scheme, host, port, path = "https", scp.group(1), None, "/" + scp.group(2).lstrip("/")
    else:
        try:
            parts = urlsplit(remote)
            port = parts.port
        except ValueError:
            return None
        if parts.scheme not in ("http", "https", "ssh", "git+ssh") or not parts.hostname:
            return None
        host, path = parts.hostname, parts.path
        scheme = parts.scheme if parts.scheme in ("http", "https") else "https"
        if scheme == "https" and parts.scheme != "https":
            port = None  # an ssh port is no https port
    if PLACEHOLDER_HOSTS.search(host.lower()) or not path.strip("/"):
        return None
    path = path.rstrip("/").removesuffix(".git")
    return f"{scheme}://{host}{f':{port}' if port else ''}{path}"


def git_revision(repo: Path = REPO_ROOT) -> str | None:
    """HEAD, when the tracked files are as committed (the wheel is built from the working tree);
    None for a changed tree or no git checkout: no revision label then."""

    def run_git(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True)

    head = run_git("rev-parse", "--verify", "HEAD")
    if head.returncode != 0 or run_git("diff", "--quiet", "HEAD", "--").returncode != 0:
        return None
    return head.stdout.strip()


def default_epoch() -> int:
    """SOURCE_DATE_EPOCH from the environment, else the commit time of HEAD."""
    value = os.environ.get("SOURCE_DATE_EPOCH") or git("log", "-1", "--format=%ct")
    if not value.isdigit():
        raise BuildError("set SOURCE_DATE_EPOCH (not a git checkout, so no commit time to use)")
    return int(value)


def manylinux_platforms(glibc_minor: int = GLIBC_MINOR) -> list[str]:
    """Every manylinux platform tag a glibc 2.<glibc_minor> x86_64 system runs, newest first."""
    tags = [f"manylinux_2_{minor}_x86_64" for minor in range(glibc_minor, 4, -1)]
    return tags + ["manylinux2014_x86_64", "manylinux2010_x86_64", "manylinux1_x86_64"]


def pip_platform_args() -> list[str]:
    args = [
        "--only-binary=:all:",
        "--python-version",
        PYTHON_VERSION,
        "--implementation",
        "cp",
        "--abi",
        "cp" + PYTHON_VERSION.replace(".", ""),
        "--abi",
        "abi3",
        "--abi",
        "none",
    ]
    for tag in [*manylinux_platforms(), "any"]:
        args += ["--platform", tag]
    return args


def lock_hashes(lock: Path = LOCK_FILE) -> dict[str, str]:
    """sha256 -> requirement line, for every hash the lock file pins."""
    hashes: dict[str, str] = {}
    for line in lock.read_text().splitlines():
        requirement = line.split("#", 1)[0].strip()
        for digest in re.findall(r"--hash=sha256:([0-9a-f]{64})", requirement):
            hashes[digest] = requirement.split()[0]
    if not hashes:
        raise BuildError(f"{lock} pins no hashes")
    return hashes


def dependency_wheels(cache: Path) -> list[Path]:
    """The locked wheels, downloaded into ``cache`` when not there yet (hash-checked by pip)."""
    cache.mkdir(parents=True, exist_ok=True)
    wanted = lock_hashes()
    have = {sha256_hex(path): path for path in cache.glob("*.whl")}
    if not set(wanted) <= set(have):
        run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--quiet",
                "--no-deps",
                "--require-hashes",
                *pip_platform_args(),
                "-d",
                cache,
                "-r",
                LOCK_FILE,
            ]
        )
        have = {sha256_hex(path): path for path in cache.glob("*.whl")}
    found = {digest: path for digest, path in have.items() if digest in wanted}
    names = {wanted[digest].split("==")[0].lower() for digest in wanted}
    if len({wanted[d].split("==")[0].lower() for d in found}) != len(names):
        missing = sorted(names - {wanted[d].split("==")[0].lower() for d in found})
        raise BuildError(f"no wheel with a locked hash for: {', '.join(missing)}")
    return sorted(found.values(), key=lambda path: path.name)


def sha256_hex(path: Path) -> str:
    return oci.sha256_file(path).split(":", 1)[1]


def project_wheel(work: Path, epoch: int) -> Path:
    """Build kubegpu's wheel from the git-tracked files plus the generated CRI stubs only."""
    tracked = git("ls-files", "-z")
    if not tracked:
        raise BuildError(f"{REPO_ROOT} is not a git checkout: cannot tell the project's files")
    missing = [name for name in GENERATED if not (REPO_ROOT / name).is_file()]
    if missing:
        raise BuildError(f"generated protobuf modules missing ({', '.join(missing)}): run `make proto`")
    src = work / "src"
    for name in [*tracked.split("\0"), *GENERATED]:
        if name and (REPO_ROOT / name).is_file():
            target = src / name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO_ROOT / name, target)
    dist = work / "dist"
    env = dict(os.environ, SOURCE_DATE_EPOCH=str(epoch), PYTHONHASHSEED="0")
    run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--quiet",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            dist,
            src,
        ],
        env=env,
    )
    wheels = list(dist.glob("kubegpu-*.whl"))
    if len(wheels) != 1:
        raise BuildError(f"expected one kubegpu wheel, got {wheels}")
    return wheels[0]


def mirror_sources(opts: Options) -> list[str]:
    """The sources.list lines of Debian's mirrors: whatever versions they serve now."""
    return [
        f"deb {opts.mirror} {DEBIAN_SUITE} main",
        f"deb {opts.mirror} {DEBIAN_SUITE}-updates main",
        f"deb {opts.security_mirror} {DEBIAN_SUITE}-security main",
    ]


def packages_stanza(control: str, filename: str, size: int, sha256: str) -> str:
    """One entry of a flat repository's ``Packages`` index: the .deb's control fields, then where
    the file lies (relative to the repository) and its size and hash, which apt checks."""
    return f"{control.strip()}\nFilename: ./{filename}\nSize: {size}\nSHA256: {sha256}\n"


def local_repository(debs: Sequence[Path], repo: Path) -> str:
    """A flat apt repository in ``repo`` holding exactly ``debs``; its sources.list line. apt's
    ``copy`` method copies the files into the tree's archive directory, as a download would."""
    repo.mkdir(parents=True)
    stanzas = []
    for deb in sorted(debs, key=lambda path: path.name):
        target = repo / deb.name
        if target.exists():
            raise BuildError(f"two .deb files named {deb.name} given")
        shutil.copyfile(deb, target)
        control = run(["dpkg-deb", "--field", target]).stdout
        stanzas.append(packages_stanza(control, deb.name, target.stat().st_size, sha256_hex(target)))
    (repo / "Packages").write_text("\n".join(stanzas))
    return f"deb [trusted=yes] copy://{repo} ./"


def pinned_mismatch(given: Sequence[str], used: Sequence[str]) -> str | None:
    """Why the packages a pinned build used (``name=version``) are not exactly the ones it was
    given, or None when they are: a given package the image does not need is as wrong as a missing
    one, since the build would then not be the one that produced ``given``."""
    unused, extra = sorted(set(given) - set(used)), sorted(set(used) - set(given))
    if not unused and not extra:
        return None
    parts = [f"given but not used: {' '.join(unused)}"] if unused else []
    parts += [f"used but not given: {' '.join(extra)}"] if extra else []
    return "; ".join(parts)


def debian_rootfs(rootfs: Path, opts: Options) -> list[Path]:
    """Unpack the Debian packages into ``rootfs``; return the .deb files used (in the tree).

    From the mirrors, or, when ``opts.debs`` is given, from a local repository of exactly those
    files (beside ``rootfs``), failing unless the image's packages are exactly them."""
    if opts.debs:
        sources = [local_repository(opts.debs, rootfs.with_name(rootfs.name + "-debs"))]
    else:
        sources = mirror_sources(opts)
    run(
        [
            "mmdebstrap",
            "--quiet",
            "--variant=extract",
            "--mode=root",
            "--format=directory",
            "--include=" + ",".join(DEBIAN_PACKAGES),
            "--skip=cleanup/apt/cache",
            '--aptopt=Acquire::Retries "3"',
            DEBIAN_SUITE,
            rootfs,
            *sources,
        ],
        env=dict(os.environ, SOURCE_DATE_EPOCH=str(opts.epoch)),
    )
    debs = sorted((rootfs / "var/cache/apt/archives").glob("*.deb"))
    if not debs:
        raise BuildError("mmdebstrap left no packages in var/cache/apt/archives")
    if opts.debs:
        mismatch = pinned_mismatch(package_versions(opts.debs), package_versions(debs))
        if mismatch:
            raise BuildError(f"the given .deb files are not the image's packages: {mismatch}")
    return debs


def keep_debs(debs: Sequence[Path], store: Path) -> list[Path]:
    """Copy the .deb files a build used into ``store`` (the cache), each as
    ``<sha256>/<file name>``, so that a later build can be given exactly these (``Options.debs``)
    after the mirrors have moved on; return the kept paths, sorted by file name. A file already
    kept is not copied again, and a partly copied one is never seen under its final name."""
    kept = []
    for deb in debs:
        target = store / sha256_hex(deb) / deb.name
        if not target.is_file():
            target.parent.mkdir(parents=True, exist_ok=True)
            partial = target.with_name(f".{deb.name}.{os.getpid()}.partial")
            shutil.copyfile(deb, partial)
            os.replace(partial, target)
        kept.append(target)
    return sorted(kept, key=lambda path: path.name)


def dpkg_status(debs: Sequence[Path]) -> str:
    """A dpkg status file for the unpacked packages, sorted by name (for image scanners)."""
    stanzas = []
    for deb in debs:
        control = run(["dpkg-deb", "--field", deb]).stdout.strip("\n")
        lines = control.splitlines()
        lines.insert(1, "Status: install ok installed")
        stanzas.append((lines[0], "\n".join(lines)))
    return "".join(text + "\n\n" for _, text in sorted(stanzas))


def package_versions(debs: Sequence[Path]) -> list[str]:
    """``name=version`` of each .deb, the Debian inputs of the image."""
    out = []
    for deb in debs:
        fields = run(["dpkg-deb", "--show", "--showformat=${Package}=${Version}", deb]).stdout
        out.append(fields.strip())
    return sorted(out)


def prune(rootfs: Path) -> None:
    for name in PRUNE:
        path = rootfs / name
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        elif path.exists() or path.is_symlink():
            path.unlink()
    docs = rootfs / "usr/share/doc"
    if docs.is_dir():
        for path in sorted(docs.rglob("*"), reverse=True):
            if path.is_symlink() or (path.is_file() and path.name != "copyright"):
                path.unlink()
            elif path.is_dir() and not any(path.iterdir()):
                path.rmdir()
    dpkg = rootfs / "var/lib/dpkg"
    if dpkg.is_dir():
        shutil.rmtree(dpkg)


def add_user_files(rootfs: Path) -> None:
    """root and nonroot (65532) accounts, /tmp, the home directory, an empty /dev."""
    etc = rootfs / "etc"
    (etc / "passwd").write_text(
        "root:x:0:0:root:/root:/usr/sbin/nologin\n"
        f"{USER_NAME}:x:{UID}:{GID}:{USER_NAME}:/home/{USER_NAME}:/usr/sbin/nologin\n"
    )
    (etc / "group").write_text(f"root:x:0:\n{USER_NAME}:x:{GID}:\n")
    for path in (etc / "passwd", etc / "group"):
        path.chmod(0o644)
    home = rootfs / "home" / USER_NAME
    home.mkdir(parents=True, exist_ok=True)
    os.chown(home, UID, GID)
    home.chmod(0o755)
    (rootfs / "root").mkdir(mode=0o700, exist_ok=True)
    for name, mode in (("tmp", 0o1777), ("dev", 0o755), ("proc", 0o555), ("sys", 0o555)):
        (rootfs / name).mkdir(exist_ok=True)
        (rootfs / name).chmod(mode)


@contextmanager
def standard_umask() -> Iterator[None]:
    """umask 0022 meanwhile: files the build creates (the wheels' files, directories) get the same
    modes on every machine, whatever the builder's own umask (0002 on many desktops)."""
    old = os.umask(UMASK)
    try:
        yield
    finally:
        os.umask(old)


def install_wheels(wheels: Sequence[Path], destdir: Path) -> None:
    """Install wheels under ``destdir`` as the image's Python would see them (no bytecode yet)."""
    with standard_umask():
        _install_wheels(wheels, destdir)


def _install_wheels(wheels: Sequence[Path], destdir: Path) -> None:
    from installer import install
    from installer.destinations import SchemeDictionaryDestination
    from installer.sources import WheelFile

    scheme = {
        "purelib": SITE_PACKAGES,
        "platlib": SITE_PACKAGES,
        "scripts": "/usr/local/bin",
        "data": "/usr/local",
        "headers": f"/usr/local/include/python{PYTHON_VERSION}",
    }
    destination = SchemeDictionaryDestination(
        scheme, interpreter=INTERPRETER, script_kind="posix", destdir=str(destdir)
    )
    for wheel in wheels:
        with WheelFile.open(wheel) as source:
            install(source, destination, additional_metadata={"INSTALLER": b"kubegpu-image-build\n"})


def strip_tests(site_packages: Path) -> None:
    """Remove the third-party packages' own test suites (``tests``/``test`` directories below a
    top-level package): never imported at run time."""
    for package in sorted(site_packages.iterdir()):
        if not package.is_dir() or package.name.endswith((".dist-info", ".libs")):
            continue
        for path in sorted(package.rglob("*")):
            if path.name in ("tests", "test") and path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)


def labels(opts: Options, version: str, debian: Sequence[str]) -> dict[str, str]:
    """The image's labels; source and revision only when known (no placeholder values)."""
    known = {
        "org.opencontainers.image.source": opts.source,
        "org.opencontainers.image.revision": opts.revision,
    }
    return {
        "org.opencontainers.image.title": "kubegpu",
        "org.opencontainers.image.description": DESCRIPTION,
        "org.opencontainers.image.version": version,
        **{key: value for key, value in known.items() if value},
        "org.opencontainers.image.base.name": f"debian:{DEBIAN_SUITE} ({', '.join(DEBIAN_PACKAGES)})",
        "dev.kubegpu.image.debian-packages": " ".join(debian),
        "dev.kubegpu.image.requirements-lock": sha256_hex(LOCK_FILE),
    }


def build(opts: Options) -> dict[str, object]:
    """Build the image tar at ``opts.out``; return what was built (digests, sizes, packages)."""
    with standard_umask():
        return _build(opts)


def _build(opts: Options) -> dict[str, object]:
    version = project_version()
    opts.out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="kgimage-", dir=opts.out.parent) as tmp:
        work = Path(tmp)
        wheel = project_wheel(work, opts.epoch)
        deps = dependency_wheels(opts.cache / "wheels")
        rootfs = work / "rootfs"
        debs = debian_rootfs(rootfs, opts)
        kept_debs = keep_debs(debs, opts.cache / "debs")
        debian = package_versions(debs)
        status = dpkg_status(debs)
        prune(rootfs)
        (rootfs / "var/lib/dpkg").mkdir(parents=True)
        (rootfs / "var/lib/dpkg/status").write_text(status)
        add_user_files(rootfs)
        install_wheels(deps, rootfs)
        strip_tests(rootfs / SITE_PACKAGES.lstrip("/"))
        app = work / "app"
        install_wheels([wheel], app)

        layout = work / "layout"
        store = oci.BlobStore(layout)
        layers = [store.add_layer(rootfs, opts.epoch), store.add_layer(app, opts.epoch)]
        history = [
            f"debian {DEBIAN_SUITE} {' '.join(DEBIAN_PACKAGES)} + {len(deps)} wheels from {LOCK_FILE.name}",
            f"kubegpu {version} wheel",
        ]
        image_config = oci.ImageConfig(
            entrypoint=["kubegpu"], user=f"{UID}:{GID}", env=ENV, labels=labels(opts, version, debian)
        )
        config = store.add_json(
            oci.config_document(image_config, layers, history, opts.epoch), oci.MEDIA_CONFIG
        )
        annotations = {
            key: value
            for key, value in image_config.labels.items()
            if key.startswith("org.opencontainers.image.")
        }
        manifest = store.add_json(oci.manifest_document(config, layers, annotations), oci.MEDIA_MANIFEST)
        partial = work / "image.tar"
        oci.write_layout_tar(layout, oci.index_document(manifest, opts.ref), partial, opts.epoch)
        os.replace(partial, opts.out)  # same filesystem: never a half-written tar at --out
    return {
        "ref": opts.ref,
        "tar": str(opts.out),
        "digest": manifest.digest,
        "config": config.digest,
        "layers": [
            {
                "digest": layer.blob.digest,
                "compressed": layer.blob.size,
                "uncompressed": layer.uncompressed_size,
            }
            for layer in layers
        ],
        "compressed_bytes": sum(layer.blob.size for layer in layers),
        "uncompressed_bytes": sum(layer.uncompressed_size for layer in layers),
        "source_date_epoch": opts.epoch,
        "debian_packages": debian,
        "debs": [str(path) for path in kept_debs],
    }


def import_into_containerd(tar: Path, address: str, namespace: str = "k8s.io", ctr: str = "ctr") -> None:
    """``ctr images import`` the tar into the containerd at ``address``."""
    run([ctr, "--address", address, "--namespace", namespace, "images", "import", tar])


def default_cache() -> Path:
    """``~/.cache/kubegpu/image`` (XDG_CACHE_HOME honoured), beside the Go test binaries."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "kubegpu" / "image"


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    version = project_version()
    parser = argparse.ArgumentParser(prog="python -m tools.image.build", description=__doc__.split("\n")[0])
    out = REPO_ROOT / "build" / "image" / f"kubegpu-{version}.oci.tar"
    parser.add_argument("--out", type=Path, default=out)
    parser.add_argument("--ref", default=DEFAULT_REF.format(version=version), help="image name in the tar")
    source = os.environ.get("IMAGE_SOURCE") or git("remote", "get-url", "origin")
    parser.add_argument(
        "--source",
        default=source,
        help="org.opencontainers.image.source (env IMAGE_SOURCE, default the git remote origin); "
        "left out when it is no public URL",
    )
    parser.add_argument("--cache", type=Path, default=default_cache(), help="wheel download cache")
    parser.add_argument("--mirror", default=DEBIAN_MIRROR)
    parser.add_argument("--security-mirror", default=DEBIAN_SECURITY)
    parser.add_argument(
        "--import",
        dest="import_address",
        metavar="SOCKET",
        help="import the tar into the containerd at this socket (k8s.io namespace)",
    )
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        opts = Options(
            out=args.out.resolve(),
            ref=args.ref,
            epoch=default_epoch(),
            source=source_url(args.source or ""),
            revision=git_revision(),
            cache=args.cache,
            mirror=args.mirror,
            security_mirror=args.security_mirror,
        )
        if os.geteuid() != 0:
            raise BuildError("needs root (mmdebstrap --mode=root)")
        result = build(opts)
        if args.import_address:
            import_into_containerd(opts.out, args.import_address)
    except BuildError as exc:
        print(f"image build: {exc}", file=sys.stderr)
        return 1
    import json

    print(json.dumps(result, indent=2))
    mib = 1024 * 1024
    print(
        f"image {result['ref']} {result['digest']}: {result['compressed_bytes'] / mib:.1f} MiB compressed, "
        f"{result['uncompressed_bytes'] / mib:.1f} MiB unpacked -> {opts.out}",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
