"""The NRI messages kubegpu speaks are NRI's and ttrpc's on the wire (docs/nri.md, "Messages").

``proto/nri/api.proto`` and ``proto/nri/ttrpc.proto`` are our own text of the part of NRI v0.11.0's
API and of ttrpc's envelope that the node agent uses. This downloads the modules containerd v2.2.9
vendors (``github.com/containerd/nri@v0.11.0``, ``github.com/containerd/ttrpc@v1.2.7``) with
``go mod download`` as tests/test_proto_wire.py does for the CRI, compiles upstream's and ours to
FileDescriptorSets and checks that every service method, message field and enum value ours
declares is upstream's (name, number, type, label, oneof), with tests/support/protodiff.py's
``diff_subset``. ttrpc's ``request.proto`` names a placeholder ``Status`` (only ``code``); its Go
code puts genproto's ``google.rpc.Status`` on the wire, so ours is checked against that type's
struct tags (field name, number, wire type) in the genproto module ttrpc's go.mod names. Without go
and the module proxy: skipped here, failed under CI=true.
"""

from __future__ import annotations

import re
from dataclasses import replace

import pytest

from tests.fixtures.common import missing_component
from tests.support.protodiff import ApiView, FieldSig, MessageSig, MethodSig, api_view, diff_subset
from tests.test_proto_wire import REPO, find_go, go_mod_download, protoc_descriptor_set

NRI_MODULE, NRI_VERSION, NRI_PROTO = "github.com/containerd/nri", "v0.11.0", "pkg/api/api.proto"
NRI_NEWER = "v0.12.5"  # the NRI_version fields of registration and Configure come from v0.12
TTRPC_MODULE, TTRPC_VERSION, TTRPC_PROTO = "github.com/containerd/ttrpc", "v1.2.7", "request.proto"
GENPROTO_RPC = "google.golang.org/genproto/googleapis/rpc"
_GO_FIELD = re.compile(r'`protobuf:"(\w+),(\d+),(opt|rep),name=(\w+)')
_WIRE_OF = {
    "int32": "varint",
    "int64": "varint",
    "bool": "varint",
    "string": "bytes",
    "bytes": "bytes",
    "message": "bytes",
}
OURS = REPO / "proto" / "nri"


def _upstream(tmp_path_factory: pytest.TempPathFactory, module: str, version: str, proto: str) -> ApiView:
    go = find_go()
    if go is None:
        missing_component(f"the go tool is needed to fetch {module} (not on PATH)")
    assert go is not None
    work = tmp_path_factory.mktemp("nri-upstream")
    root = go_mod_download(go, module, version, work / "gomod")
    if not (root / proto).is_file():
        missing_component(f"{module}@{version} has no {proto}")
    fds = protoc_descriptor_set([str(root)], str(root / proto), work / "upstream.pb")
    return api_view(fds.file, fds.file[-1].package)


def _ours(tmp_path_factory: pytest.TempPathFactory, name: str) -> ApiView:
    out = tmp_path_factory.mktemp("nri-ours") / f"{name}.pb"
    fds = protoc_descriptor_set([f"crishim/nri={OURS}"], f"crishim/nri/{name}.proto", out)
    return api_view(fds.file, fds.file[-1].package)


def _fail_on(diffs: list[str], ours: str, where: str) -> None:
    if diffs:
        pytest.fail(
            f"proto/nri/{ours}.proto differs from {where} ({len(diffs)} differences):\n  "
            + "\n  ".join(diffs),
            pytrace=False,
        )


def test_our_nri_api_messages_are_nris_on_the_wire(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Every field ours declares is v0.11.0's (containerd v2.2.9's) on the wire, or, for the few
    v0.11.0 lacks (``NRI_version``, which such a runtime leaves empty), a newer release's."""
    upstream = _upstream(tmp_path_factory, NRI_MODULE, NRI_VERSION, NRI_PROTO)
    newer = _upstream(tmp_path_factory, NRI_MODULE, NRI_NEWER, NRI_PROTO)
    mine = _ours(tmp_path_factory, "api")
    for message in (
        "CreateContainerRequest",
        "CreateContainerResponse",
        "ContainerAdjustment",
        "SynchronizeRequest",
    ):
        assert f".nri.pkg.api.v1alpha1.{message}" in mine.messages  # not an empty comparison
    against_newer = diff_subset(newer, mine)
    diffs = [d for d in diff_subset(upstream, mine) if not d.startswith("extra field") or d in against_newer]
    diffs += [d for d in against_newer if not d.startswith("extra ")]
    _fail_on(diffs, "api", f"{NRI_MODULE}@{NRI_VERSION} (and {NRI_NEWER}) {NRI_PROTO}")


def test_our_ttrpc_envelope_is_ttrpcs_on_the_wire(tmp_path_factory: pytest.TempPathFactory) -> None:
    upstream = _upstream(tmp_path_factory, TTRPC_MODULE, TTRPC_VERSION, TTRPC_PROTO)
    mine = _ours(tmp_path_factory, "ttrpc")
    assert {".ttrpc.Request", ".ttrpc.Response"} <= mine.messages.keys()
    # request.proto's placeholder Status lives in no package: name it as ours does, then compare
    response = upstream.messages[".ttrpc.Response"]
    status = replace(response.fields["status"], type_name=".ttrpc.Status")
    messages = dict(upstream.messages)
    messages[".ttrpc.Response"] = replace(response, fields={**response.fields, "status": status})
    envelope = replace(upstream, messages=messages)
    mine_without_status = replace(
        mine, messages={k: v for k, v in mine.messages.items() if k != ".ttrpc.Status"}
    )
    _fail_on(
        diff_subset(envelope, mine_without_status), "ttrpc", f"{TTRPC_MODULE}@{TTRPC_VERSION} {TTRPC_PROTO}"
    )
    # the Status on the wire: genproto's google.rpc.Status, at the version ttrpc's go.mod names
    go = find_go()
    assert go is not None
    work = tmp_path_factory.mktemp("genproto")
    ttrpc_root = go_mod_download(go, TTRPC_MODULE, TTRPC_VERSION, work / "ttrpc")
    version = re.search(rf"{re.escape(GENPROTO_RPC)}\s+(\S+)", (ttrpc_root / "go.mod").read_text())
    assert version, f"{TTRPC_MODULE}@{TTRPC_VERSION}'s go.mod names no {GENPROTO_RPC}"
    rpc_root = go_mod_download(go, GENPROTO_RPC, version[1], work / "rpc")
    tags = {
        name: (int(number), wire)
        for wire, number, _, name in _GO_FIELD.findall((rpc_root / "status" / "status.pb.go").read_text())
    }
    assert tags.get("code") == (1, "varint"), tags
    diffs = []
    for name, field in mine.messages[".ttrpc.Status"].fields.items():
        if tags.get(name) != (field.number, _WIRE_OF.get(field.type, field.type)):
            diffs.append(
                f"field .ttrpc.Status.{name}: google.rpc.Status has {tags.get(name)}, ours "
                f"{(field.number, field.type)}"
            )
    _fail_on(diffs, "ttrpc", f"{GENPROTO_RPC}@{version[1]} status.Status")


# -- the subset comparator can fail --------------------------------------------------------------


def _view(
    fields: dict[str, FieldSig],
    methods: dict[str, MethodSig] | None = None,
    enum: dict[str, int] | None = None,
) -> ApiView:
    return ApiView(
        ("proto3",),
        {".p.S": methods or {}},
        {".p.M": MessageSig(fields, (), False)},
        {".p.E": enum or {"A": 0}},
    )


def _field(number: int, kind: str = "string") -> FieldSig:
    return FieldSig(number, kind, "", "optional", None, False, None)


CALL = MethodSig(".p.M", ".p.M", False, False)


def test_the_subset_allows_what_upstream_has_beyond_ours() -> None:
    upstream = _view({"a": _field(1), "b": _field(2)}, {"Call": CALL, "Other": CALL}, {"A": 0, "B": 1})
    assert diff_subset(upstream, _view({"a": _field(1)}, {"Call": CALL})) == []


@pytest.mark.parametrize(
    ("ours", "expected"),
    [
        (_view({"a": _field(3)}), "field .p.M.a number differs: upstream 1, ours 3"),
        (_view({"a": _field(1, "bytes")}), "field .p.M.a type differs"),
        (_view({"a": _field(1), "z": _field(9)}), "extra field .p.M.z"),
        (_view({"a": _field(1)}, {"Gone": CALL}), "extra method .p.S/Gone"),
        (
            _view({"a": _field(1)}, {"Call": MethodSig(".p.M", ".p.M", False, True)}),
            "method .p.S/Call differs",
        ),
        (_view({"a": _field(1)}, enum={"A": 1}), "enum value .p.E.A number differs"),
    ],
)
def test_the_subset_catches_what_would_break_the_wire(ours: ApiView, expected: str) -> None:
    upstream = _view({"a": _field(1)}, {"Call": CALL})
    assert any(expected in d for d in diff_subset(upstream, ours)), diff_subset(upstream, ours)


def test_an_empty_side_is_a_difference() -> None:
    empty = ApiView((), {}, {}, {})
    assert diff_subset(empty, _view({"a": _field(1)})) != []
