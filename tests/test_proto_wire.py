"""Wire compatibility of our CRI proto (proto/runtime/v1/api.proto) with upstream k8s.io/cri-api.

The shim sits between kubelet and containerd, so every message it parses or forwards must encode
exactly as upstream's. This test fetches upstream's api.proto from the k8s.io/cri-api Go module
(through the Go module proxy, cached in the default GOMODCACHE), compiles it and ours to
FileDescriptorSets with grpc_tools.protoc, and compares them with tests.support.protodiff: any
missing, extra or different service, method, message, field or enum value fails the test.

The comparator itself is unit-tested below on small hand-built descriptors, so a green wire test
cannot come from a comparator that never reports anything.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from google.protobuf import descriptor_pb2

from tests.fixtures.common import missing_component
from tests.support.protodiff import diff_descriptor_sets

CRI_API_MODULE = "k8s.io/cri-api"
CRI_API_VERSION = "v0.37.2"
CRI_PROTO_IN_MODULE = "pkg/apis/runtime/v1/api.proto"
PACKAGE = "runtime.v1"

REPO = Path(__file__).resolve().parent.parent
OUR_PROTO = REPO / "proto" / "runtime" / "v1" / "api.proto"

GO_TIMEOUT_S = 300
PROTOC_TIMEOUT_S = 120

_IMPORT_RE = re.compile(r'^\s*import\s+(?:public\s+|weak\s+)?"([^"]+)"\s*;', re.MULTILINE)
_REQUIRE_RE = re.compile(r"^\s*(?:require\s+)?([\w.\-/~]+)\s+(v\S+)", re.MULTILINE)


# --------------------------------------------------------------------------------------------
# Fetching and compiling
# --------------------------------------------------------------------------------------------


def find_go() -> str | None:
    """Path of the go tool: PATH first, then the usual install location."""
    found = shutil.which("go")
    if found:
        return found
    default = Path("/usr/local/go/bin/go")
    return str(default) if default.is_file() else None


def go_mod_download(go: str, module: str, version: str, workdir: Path) -> Path:
    """Download ``module@version`` into the module cache and return its directory.

    Runs ``go mod download -json`` inside a throwaway module in ``workdir`` (created if needed).
    Any failure (no network, unknown version) becomes ``missing_component``.
    """
    workdir.mkdir(parents=True, exist_ok=True)
    if not (workdir / "go.mod").exists():
        init = subprocess.run(
            [go, "mod", "init", "kubegpu.test/protowire"],
            cwd=workdir,
            capture_output=True,
            text=True,
            timeout=GO_TIMEOUT_S,
        )
        if init.returncode != 0:
            missing_component(f"go mod init failed: {init.stderr.strip()}")
    try:
        proc = subprocess.run(
            [go, "mod", "download", "-json", f"{module}@{version}"],
            cwd=workdir,
            capture_output=True,
            text=True,
            timeout=GO_TIMEOUT_S,
        )
    except subprocess.TimeoutExpired:
        missing_component(f"go mod download {module}@{version} timed out")
        raise  # unreachable: missing_component raises
    info: dict[str, str] = {}
    if proc.stdout.strip():
        try:
            info = json.loads(proc.stdout)
        except json.JSONDecodeError:
            info = {}
    if proc.returncode != 0 or "Dir" not in info:
        detail = info.get("Error") or proc.stderr.strip() or proc.stdout.strip()
        missing_component(f"go mod download {module}@{version} failed: {detail}")
    return Path(info["Dir"])


def proto_imports(proto_text: str) -> list[str]:
    """The import paths declared in a .proto source."""
    return _IMPORT_RE.findall(proto_text)


def go_requirements(go_mod_text: str) -> dict[str, str]:
    """Module path -> version for every requirement in a go.mod (single and block form)."""
    reqs: dict[str, str] = {}
    in_block = False
    for raw in go_mod_text.splitlines():
        line = raw.split("//", 1)[0].strip()
        if line.startswith("require ("):
            in_block = True
            continue
        if in_block and line == ")":
            in_block = False
            continue
        if in_block or line.startswith("require "):
            match = _REQUIRE_RE.match(line)
            if match:
                reqs[match.group(1)] = match.group(2)
    return reqs


def module_for_import(import_path: str, requirements: dict[str, str]) -> str | None:
    """The longest required module path that is a prefix of ``import_path``, if any."""
    candidates = [m for m in requirements if import_path.startswith(m + "/")]
    return max(candidates, key=len) if candidates else None


def upstream_include_dirs(go: str, cri_dir: Path, workdir: Path) -> list[Path]:
    """Include directories that make upstream's api.proto compile.

    Imports of ``google/protobuf/...`` come with grpc_tools. Any other import (historically
    ``github.com/gogo/protobuf/gogoproto/gogo.proto``) is resolved through cri-api's go.mod:
    the owning module is downloaded at the required version and exposed under its import path.
    """
    proto_text = (cri_dir / CRI_PROTO_IN_MODULE).read_text()
    requirements = go_requirements((cri_dir / "go.mod").read_text())
    proto_dir = (cri_dir / CRI_PROTO_IN_MODULE).parent
    tree = workdir / "include"
    dirs = [proto_dir]
    for imp in proto_imports(proto_text):
        if imp.startswith("google/protobuf/") or (proto_dir / imp).exists():
            continue
        module = module_for_import(imp, requirements)
        if module is None:
            missing_component(f"cannot tell which Go module provides upstream import {imp!r}")
            continue
        mod_dir = go_mod_download(go, module, requirements[module], workdir / "gomod")
        link = tree / module
        if not link.exists():
            link.parent.mkdir(parents=True, exist_ok=True)
            link.symlink_to(mod_dir, target_is_directory=True)
        if tree not in dirs:
            dirs.append(tree)
    return dirs


def protoc_descriptor_set(
    includes: list[str], proto: str, out: Path
) -> descriptor_pb2.FileDescriptorSet:
    """Compile ``proto`` with grpc_tools.protoc and return its FileDescriptorSet (with imports).

    ``includes`` are ``-I`` values (plain dirs or ``virtual=dir`` mappings); the compiler's
    bundled well-known types are added by ``python -m grpc_tools.protoc`` itself.
    """
    cmd = [sys.executable, "-m", "grpc_tools.protoc"]
    cmd += [f"-I{inc}" for inc in includes]
    cmd += ["--include_imports", f"--descriptor_set_out={out}", proto]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=PROTOC_TIMEOUT_S)
    assert proc.returncode == 0, f"protoc failed on {proto}:\n{proc.stderr}"
    fds = descriptor_pb2.FileDescriptorSet()
    fds.ParseFromString(out.read_bytes())
    return fds


@pytest.fixture(scope="module")
def upstream_fds(tmp_path_factory: pytest.TempPathFactory) -> descriptor_pb2.FileDescriptorSet:
    """Upstream CRI v1 API at CRI_API_VERSION, compiled to a FileDescriptorSet."""
    go = find_go()
    if go is None:
        missing_component("the go tool is needed to fetch k8s.io/cri-api (not on PATH)")
    assert go is not None
    work = tmp_path_factory.mktemp("cri-upstream")
    cri_dir = go_mod_download(go, CRI_API_MODULE, CRI_API_VERSION, work / "gomod")
    proto = cri_dir / CRI_PROTO_IN_MODULE
    if not proto.is_file():
        missing_component(f"{CRI_API_MODULE}@{CRI_API_VERSION} has no {CRI_PROTO_IN_MODULE}")
    includes = [str(d) for d in upstream_include_dirs(go, cri_dir, work)]
    return protoc_descriptor_set(includes, str(proto), work / "upstream.pb")


@pytest.fixture(scope="module")
def our_fds(tmp_path_factory: pytest.TempPathFactory) -> descriptor_pb2.FileDescriptorSet:
    """Our proto compiled exactly as ``make proto`` maps it (crishim/cri/api.proto)."""
    out = tmp_path_factory.mktemp("cri-ours") / "ours.pb"
    return protoc_descriptor_set([f"crishim/cri={OUR_PROTO.parent}"], "crishim/cri/api.proto", out)


# --------------------------------------------------------------------------------------------
# The wire test
# --------------------------------------------------------------------------------------------


def test_our_proto_is_wire_identical_to_upstream(
    upstream_fds: descriptor_pb2.FileDescriptorSet, our_fds: descriptor_pb2.FileDescriptorSet
) -> None:
    """Every service, method, message, field and enum of runtime.v1 matches upstream."""
    diffs = diff_descriptor_sets(upstream_fds, our_fds, PACKAGE)
    if diffs:
        pytest.fail(
            f"proto/runtime/v1/api.proto differs from {CRI_API_MODULE}@{CRI_API_VERSION} "
            f"({len(diffs)} differences):\n  " + "\n  ".join(diffs),
            pytrace=False,
        )


def test_our_proto_has_no_imports_or_go_options() -> None:
    """Ours stays self-contained: no imports (gogo or otherwise) and no go_package option."""
    text = OUR_PROTO.read_text()
    assert proto_imports(text) == []
    assert "go_package" not in text
    assert "gogoproto" not in text


def test_upstream_api_is_not_empty(upstream_fds: descriptor_pb2.FileDescriptorSet) -> None:
    """Guard against comparing two empty sets: upstream must define both CRI services."""
    services = {s.name for f in upstream_fds.file if f.package == PACKAGE for s in f.service}
    assert {"RuntimeService", "ImageService"} <= services


# --------------------------------------------------------------------------------------------
# The comparator catches what it must (so the wire test can fail)
# --------------------------------------------------------------------------------------------

FieldProto = descriptor_pb2.FieldDescriptorProto


def tiny_api() -> descriptor_pb2.FileDescriptorSet:
    """A small runtime.v1-like API: one service with a unary and a streaming method."""
    f = descriptor_pb2.FileDescriptorProto(name="tiny.proto", package=PACKAGE, syntax="proto3")
    req = f.message_type.add(name="PingRequest")
    req.field.add(name="id", number=1, type=FieldProto.TYPE_STRING, label=FieldProto.LABEL_OPTIONAL)
    entry = req.nested_type.add(name="LabelsEntry")
    entry.options.map_entry = True
    entry.field.add(
        name="key", number=1, type=FieldProto.TYPE_STRING, label=FieldProto.LABEL_OPTIONAL
    )
    entry.field.add(
        name="value", number=2, type=FieldProto.TYPE_STRING, label=FieldProto.LABEL_OPTIONAL
    )
    req.field.add(
        name="labels",
        number=2,
        type=FieldProto.TYPE_MESSAGE,
        type_name=f".{PACKAGE}.PingRequest.LabelsEntry",
        label=FieldProto.LABEL_REPEATED,
    )
    resp = f.message_type.add(name="PingResponse")
    resp.field.add(
        name="count", number=1, type=FieldProto.TYPE_INT64, label=FieldProto.LABEL_OPTIONAL
    )
    enum = f.enum_type.add(name="Mode")
    enum.value.add(name="OFF", number=0)
    enum.value.add(name="ON", number=1)
    svc = f.service.add(name="PingService")
    svc.method.add(
        name="Ping", input_type=f".{PACKAGE}.PingRequest", output_type=f".{PACKAGE}.PingResponse"
    )
    svc.method.add(
        name="Watch",
        input_type=f".{PACKAGE}.PingRequest",
        output_type=f".{PACKAGE}.PingResponse",
        server_streaming=True,
    )
    return descriptor_pb2.FileDescriptorSet(file=[f])


def perturbed(
    change: Callable[[descriptor_pb2.FileDescriptorProto], None],
) -> descriptor_pb2.FileDescriptorSet:
    """A copy of tiny_api() with ``change`` applied to its only file."""
    fds = tiny_api()
    change(fds.file[0])
    return fds


def _field(f: descriptor_pb2.FileDescriptorProto, msg: str, name: str) -> FieldProto:
    """Look up one field of a top-level message of ``f``."""
    message = next(m for m in f.message_type if m.name == msg)
    return next(x for x in message.field if x.name == name)


def test_comparator_accepts_identical_apis() -> None:
    """Identical descriptor sets give no differences."""
    assert diff_descriptor_sets(tiny_api(), tiny_api(), PACKAGE) == []


def test_comparator_catches_changed_field_number() -> None:
    """A renumbered field is reported with both numbers."""
    ours = perturbed(lambda f: setattr(_field(f, "PingRequest", "id"), "number", 7))
    diffs = diff_descriptor_sets(tiny_api(), ours, PACKAGE)
    assert diffs == [f"field .{PACKAGE}.PingRequest.id number differs: upstream 1, ours 7"]


def test_comparator_catches_changed_field_type() -> None:
    """A field whose scalar type changed (int64 -> int32) is reported."""
    ours = perturbed(
        lambda f: setattr(_field(f, "PingResponse", "count"), "type", FieldProto.TYPE_INT32)
    )
    diffs = diff_descriptor_sets(tiny_api(), ours, PACKAGE)
    assert diffs == [
        f"field .{PACKAGE}.PingResponse.count type differs: upstream 'int64', ours 'int32'"
    ]


def test_comparator_catches_missing_and_extra_method() -> None:
    """A method missing from ours is reported, and so is one only ours has."""
    ours = perturbed(lambda f: f.service[0].method.pop())
    assert diff_descriptor_sets(tiny_api(), ours, PACKAGE) == [
        f"missing method .{PACKAGE}.PingService/Watch (upstream has it, ours does not)"
    ]
    assert diff_descriptor_sets(ours, tiny_api(), PACKAGE) == [
        f"extra method .{PACKAGE}.PingService/Watch (ours has it, upstream does not)"
    ]


def test_comparator_catches_changed_streaming_kind() -> None:
    """Turning a server-streaming method into a unary one is reported."""
    ours = perturbed(lambda f: setattr(f.service[0].method[1], "server_streaming", False))
    diffs = diff_descriptor_sets(tiny_api(), ours, PACKAGE)
    assert len(diffs) == 1
    assert diffs[0].startswith(f"method .{PACKAGE}.PingService/Watch differs")
    assert "returns (stream" in diffs[0]


def test_comparator_catches_map_label_oneof_and_enum_changes() -> None:
    """Map entry, label, oneof membership and enum value changes are all reported."""

    def change(f: descriptor_pb2.FileDescriptorProto) -> None:
        req = f.message_type[0]
        req.nested_type[0].options.map_entry = False
        _field(f, "PingRequest", "id").label = FieldProto.LABEL_REPEATED
        req.oneof_decl.add(name="choice")
        _field(f, "PingResponse", "count").proto3_optional = True
        f.enum_type[0].value[1].number = 2
        f.enum_type[0].value.add(name="AUTO", number=3)

    diffs = diff_descriptor_sets(tiny_api(), perturbed(change), PACKAGE)
    text = "\n".join(diffs)
    assert f"message .{PACKAGE}.PingRequest.LabelsEntry map_entry differs" in text
    assert f"field .{PACKAGE}.PingRequest.id label differs" in text
    assert f"message .{PACKAGE}.PingRequest oneofs differ" in text
    assert f"field .{PACKAGE}.PingResponse.count proto3_optional differs" in text
    assert f"enum value .{PACKAGE}.Mode.ON number differs: upstream 1, ours 2" in text
    assert f"extra enum value .{PACKAGE}.Mode.AUTO" in text
    assert len(diffs) == 6


def test_comparator_reports_absent_package() -> None:
    """Comparing a package neither side defines is an error, not a vacuous pass."""
    assert diff_descriptor_sets(tiny_api(), tiny_api(), "no.such.pkg") != []


def test_import_helpers() -> None:
    """Import and go.mod parsing used to resolve upstream imports such as gogo.proto."""
    text = 'syntax = "proto3";\nimport "github.com/gogo/protobuf/gogoproto/gogo.proto";\n'
    assert proto_imports(text) == ["github.com/gogo/protobuf/gogoproto/gogo.proto"]
    go_mod = (
        "module k8s.io/cri-api\n\ngo 1.22\n\nrequire github.com/gogo/protobuf v1.3.2\n"
        "require (\n\tgoogle.golang.org/grpc v1.65.0 // indirect\n)\n"
    )
    reqs = go_requirements(go_mod)
    assert reqs == {"github.com/gogo/protobuf": "v1.3.2", "google.golang.org/grpc": "v1.65.0"}
    assert module_for_import(proto_imports(text)[0], reqs) == "github.com/gogo/protobuf"
    assert module_for_import("other/x.proto", reqs) is None
