"""The signed allocation annotation: round trip, tampering, keys and key files, the shape rules."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import time
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization

from kubegpu.allocation import (
    MAX_ANNOTATION_BYTES,
    MAX_DEVICES_PER_CONTAINER,
    Allocation,
    AllocationError,
    ContainerAllocation,
    KeyFileError,
    KeyRing,
    Share,
    canonical_bytes,
    load_keys,
    parse_key,
    path_problems,
    private_key_pem,
    public_key_base64,
    public_key_pem,
    sign,
    verify,
)
from tests.fixtures.common import require_executable
from tests.fixtures.keys import OTHER_KEY, SIGNING, public

KEYS = public()


def example() -> Allocation:
    return Allocation(
        node="gpu-node-1",
        pod_uid="11111111-2222-3333-4444-555555555555",
        containers={
            "train": ContainerAllocation(devices=("GPU-a", "GPU-b")),
            "infer": ContainerAllocation(devices=("GPU-c",), shares={"GPU-c": Share(250, 4096)}),
        },
    )


def resign(document: dict, key_id: str = "k1") -> str:
    """Re-sign a modified document correctly, to test shape rules past the signature check."""
    document = dict(document, keyId=key_id)
    document["signature"] = base64.b64encode(SIGNING[key_id].sign(canonical_bytes(document))).decode()
    return json.dumps(document)


def test_round_trip() -> None:
    value = sign(example(), "k1", SIGNING["k1"])
    assert verify(value, KEYS) == example()
    assert "/" not in json.dumps(json.loads(value)["containers"])  # no host paths


def test_key_rotation_accepts_any_known_key() -> None:
    assert verify(sign(example(), "k2", SIGNING["k2"]), KEYS) == example()
    with pytest.raises(AllocationError, match="unknown key id 'k2'"):
        verify(sign(example(), "k2", SIGNING["k2"]), {"k1": KEYS["k1"]})


@pytest.mark.parametrize(
    "mutate",
    [
        lambda d: d.__setitem__("node", "other-node"),
        lambda d: d.__setitem__("podUID", "x"),
        lambda d: d["containers"]["train"]["devices"].append("GPU-z"),
        lambda d: d["containers"]["infer"]["shares"]["GPU-c"].__setitem__("milli", 1000),
        lambda d: d.__setitem__("keyId", "k2"),
    ],
)
def test_any_change_breaks_the_signature(mutate) -> None:  # type: ignore[no-untyped-def]
    document = json.loads(sign(example(), "k1", SIGNING["k1"]))
    mutate(document)
    with pytest.raises(AllocationError, match="does not verify"):
        verify(json.dumps(document), KEYS)


def test_unsigned_and_garbage() -> None:
    document = example().to_document()
    with pytest.raises(AllocationError, match="unsigned"):
        verify(json.dumps(document), KEYS)
    for garbage in ("", "{", "[]", "null", '"x"', "1e999999", "[" * 100000):
        with pytest.raises(AllocationError):
            verify(garbage, KEYS)
    with pytest.raises(AllocationError, match="more than"):
        verify("x" * 70000, KEYS)


@pytest.mark.parametrize(
    ("patch", "message"),
    [
        ({"version": 3}, "unsupported allocation version 3 \\(this node reads versions 1, 2\\)"),
        ({"node": ""}, "no node name"),
        ({"containers": {}}, "no containers"),
        ({"containers": {"Bad_Name": {"devices": ["GPU-a"]}}}, "invalid container name"),
        ({"containers": {"c": {"devices": ["../../etc/passwd"]}}}, "invalid device id"),
        ({"containers": {"c": {"devices": ["/dev/nvidia0"]}}}, "invalid device id"),
        ({"containers": {"c": {"devices": ["GPU-a", "GPU-a"]}}}, "listed twice"),
        ({"containers": {"c": {"devices": [1]}}}, "invalid device id"),
        ({"containers": {"c": {"devices": ["GPU-a"], "shares": {"GPU-b": {"milli": 5}}}}}, "unlisted"),
        ({"containers": {"c": {"devices": ["GPU-a"], "shares": {"GPU-a": {"milli": 0}}}}}, "milli"),
        ({"containers": {"c": {"devices": ["GPU-a"], "shares": {"GPU-a": {"milli": True}}}}}, "milli"),
        ({"containers": {"a": {"devices": ["GPU-a"]}, "b": {"devices": ["GPU-a"]}}}, "given whole"),
        (
            {
                "containers": {
                    "a": {"devices": ["GPU-a"], "shares": {"GPU-a": {"milli": 600}}},
                    "b": {"devices": ["GPU-a"], "shares": {"GPU-a": {"milli": 600}}},
                }
            },
            "add up",
        ),
    ],
)
def test_shape_rules(patch: dict, message: str) -> None:
    document = json.loads(sign(example(), "k1", SIGNING["k1"]))
    document.update(patch)
    with pytest.raises(AllocationError, match=message):
        verify(resign(document), KEYS)


def test_shares_within_one_gpu_are_fine() -> None:
    allocation = Allocation(
        "n",
        "u",
        {
            "a": ContainerAllocation(("GPU-a",), {"GPU-a": Share(500)}),
            "b": ContainerAllocation(("GPU-a",), {"GPU-a": Share(500)}),
        },
    )
    assert verify(sign(allocation, "k1", SIGNING["k1"]), KEYS) == allocation


def test_a_key_id_signs_only_with_its_own_key() -> None:
    """Root on a node holds public keys only: it cannot produce a signature that verifies."""
    document = json.loads(sign(example(), "k1", OTHER_KEY))
    with pytest.raises(AllocationError, match="does not verify"):
        verify(json.dumps(document), KEYS)
    with pytest.raises(AllocationError, match="does not verify"):  # a key id names its key
        verify(sign(example(), "k1", SIGNING["k2"]), KEYS)


@pytest.mark.parametrize("signature", ["é", "☃" * 88, "AAAA", "!!notbase64!!", "A" * 87 + "=", "\x00"])
def test_a_malformed_signature_is_a_clean_refusal(signature: str) -> None:
    document = json.loads(sign(example(), "k1", SIGNING["k1"]))
    document["signature"] = signature
    with pytest.raises(AllocationError, match="not base64|does not verify"):
        verify(json.dumps(document, ensure_ascii=False), KEYS)


def test_the_size_limit_counts_utf8_bytes() -> None:
    # 30000 two-byte characters: 30000 characters, 60000 bytes, fine; 40000 of them: 80000 bytes.
    inside = json.dumps({"pad": "é" * 30000}, ensure_ascii=False)
    with pytest.raises(AllocationError, match="unsigned"):
        verify(inside, KEYS)
    outside = json.dumps({"pad": "é" * 40000}, ensure_ascii=False)
    assert len(outside) < MAX_ANNOTATION_BYTES < len(outside.encode())
    with pytest.raises(AllocationError, match="80011 bytes, more than 65536"):
        verify(outside, KEYS)


def test_the_device_limits() -> None:
    many = [f"GPU-{i}" for i in range(MAX_DEVICES_PER_CONTAINER)]
    fits = Allocation("n", "u", {"c": ContainerAllocation(tuple(many))})
    assert verify(sign(fits, "k1", SIGNING["k1"]), KEYS) == fits
    document = json.loads(sign(fits, "k1", SIGNING["k1"]))
    document["containers"]["c"]["devices"].append("GPU-64")
    with pytest.raises(AllocationError, match="65 devices, more than 64"):
        verify(resign(document), KEYS)
    document["containers"] = {f"c{i}": {"devices": [f"GPU-{i}"]} for i in range(65)}
    with pytest.raises(AllocationError, match="65 containers, more than 64"):
        verify(resign(document), KEYS)


@pytest.mark.parametrize("memory", [-1, 1 << 31, "4096", 1.5, None, True])
def test_memory_mib_must_be_a_sane_integer(memory: object) -> None:
    document = json.loads(sign(example(), "k1", SIGNING["k1"]))
    document["containers"]["infer"]["shares"]["GPU-c"]["memoryMiB"] = memory
    with pytest.raises(AllocationError, match="invalid memoryMiB"):
        verify(resign(document), KEYS)
    document["containers"]["infer"]["shares"]["GPU-c"]["memoryMiB"] = 1 << 30
    assert verify(resign(document), KEYS).containers["infer"].shares["GPU-c"].memory_mib == 1 << 30


def test_key_file_formats(tmp_path: Path) -> None:
    key = SIGNING["k1"]
    assert parse_key(private_key_pem(key)).public_key() == key.public_key()  # type: ignore[union-attr]
    assert parse_key(public_key_pem(key)) == key.public_key()
    assert parse_key(public_key_base64(key).encode() + b"\n") == key.public_key()
    for bad, why in [
        (b"", "raw public key is 32 bytes"),
        (b"not a key!", "neither PEM nor base64"),
        (base64.b64encode(os.urandom(16)), "32 bytes"),
        (b"-----BEGIN RSA PRIVATE KEY-----\nAAAA\n-----END RSA PRIVATE KEY-----\n", "unsupported PEM"),
        (b"-----BEGIN PUBLIC KEY-----\nAAAA\n-----END PUBLIC KEY-----\n", "not a readable PEM"),
    ]:
        with pytest.raises(KeyFileError, match=why):
            parse_key(bad)


def test_openssl_keys_are_accepted(tmp_path: Path) -> None:
    """The formats openssl (and Helm's genPrivateKey "ed25519": PKCS#8) produce."""
    openssl = require_executable("openssl")
    private = tmp_path / "private.pem"
    subprocess.run([openssl, "genpkey", "-algorithm", "ed25519", "-out", str(private)], check=True)
    pub = subprocess.run(
        [openssl, "pkey", "-in", str(private), "-pubout"], check=True, capture_output=True
    ).stdout
    assert private.read_bytes().startswith(b"-----BEGIN PRIVATE KEY-----")
    signer = parse_key(private.read_bytes())
    verifier = parse_key(pub)
    assert verify(sign(example(), "k9", signer), {"k9": verifier}) == example()  # type: ignore[arg-type]


def test_load_keys_from_a_secret_volume(tmp_path: Path) -> None:
    data = tmp_path / "..2026_11_26"
    data.mkdir()
    (tmp_path / "..data").symlink_to(data.name)
    (data / "k1").write_bytes(public_key_pem(SIGNING["k1"]))
    (tmp_path / "k1").symlink_to("..data/k1")
    (tmp_path / "k2").write_bytes(public_key_base64(SIGNING["k2"]).encode() + b"\n")
    (tmp_path / "bad").write_bytes(b"tooshort")
    (tmp_path / "bad name!").write_bytes(public_key_pem(SIGNING["k1"]))
    loaded = load_keys(tmp_path)
    assert loaded.public == KEYS and not loaded.private
    assert any(p.startswith("bad:") for p in loaded.problems)
    assert any("not a valid key id" in p for p in loaded.problems)
    assert not load_keys(tmp_path / "missing").public


def test_a_node_never_uses_a_private_key(tmp_path: Path) -> None:
    (tmp_path / "k1").write_bytes(private_key_pem(SIGNING["k1"]))
    node = load_keys(tmp_path)
    assert not node.public and "nodes must hold public keys only" in node.problems[0]
    (tmp_path / "k2").write_bytes(public_key_pem(SIGNING["k2"]))  # listed after the private one
    assert set(load_keys(tmp_path).public) == {"k2"}
    (tmp_path / "k2").unlink()
    scheduler = load_keys(tmp_path, allow_private=True)
    assert scheduler.public == {"k1": KEYS["k1"]}
    assert private_key_pem(scheduler.private["k1"]) == private_key_pem(SIGNING["k1"])
    ring = KeyRing(tmp_path, allow_private=True, recheck_seconds=0)
    signer = ring.signing_key("k1")
    assert signer is not None and private_key_pem(signer) == private_key_pem(SIGNING["k1"])
    assert ring.signing_key("k2") is None


def test_key_ring_rereads_added_rewritten_and_deleted_keys(tmp_path: Path) -> None:
    (tmp_path / "k1").write_bytes(public_key_pem(SIGNING["k1"]))
    (tmp_path / "k2").write_bytes(public_key_pem(SIGNING["k2"]))
    ring = KeyRing(tmp_path, recheck_seconds=0)
    assert set(ring.keys()) == {"k1", "k2"}
    stamp = time.time() + 5  # the remaining files' mtimes say nothing about a deletion
    os.utime(tmp_path / "k1", (stamp, stamp))
    (tmp_path / "k2").unlink()
    assert set(ring.keys()) == {"k1"}  # revoked without a restart
    (tmp_path / "k1").write_bytes(public_key_pem(SIGNING["k2"]))  # rewritten in place
    os.utime(tmp_path / "k1", (stamp, stamp))
    assert ring.keys()["k1"] == KEYS["k2"]
    (tmp_path / "k3").write_bytes(public_key_pem(SIGNING["k1"]))
    assert set(ring.keys()) == {"k1", "k3"}


def test_key_ring_follows_a_secret_volume_update(tmp_path: Path) -> None:
    """kubelet updates a Secret volume by re-pointing ..data at a new timestamped directory."""
    old, new = tmp_path / "..2026_11_26_1", tmp_path / "..2026_11_26_2"
    old.mkdir()
    new.mkdir()
    for key_id in ("k1", "k2"):
        (old / key_id).write_bytes(public_key_pem(SIGNING[key_id]))
    (new / "k2").write_bytes(public_key_pem(SIGNING["k2"]))
    (tmp_path / "..data").symlink_to(old.name)
    (tmp_path / "k1").symlink_to("..data/k1")
    (tmp_path / "k2").symlink_to("..data/k2")
    ring = KeyRing(tmp_path, recheck_seconds=0)
    assert set(ring.keys()) == {"k1", "k2"}
    (tmp_path / "..data_tmp").symlink_to(new.name)
    (tmp_path / "..data_tmp").rename(tmp_path / "..data")
    (tmp_path / "k1").unlink()
    assert set(ring.keys()) == {"k2"}


def test_the_managed_names_are_the_ones_the_scheduler_and_the_advertiser_use() -> None:
    """One place names how pods ask for devices; the other components must agree with it."""
    from crishim.advertiser import DEFAULT_RESOURCES
    from kubegpu.allocation import GPU_RESOURCE, MANAGED_RESOURCES, SHARE_ANNOTATIONS
    from scheduler.live import podspec
    from scheduler.live.config import SchedulerConfig

    assert set(DEFAULT_RESOURCES.values()) == set(MANAGED_RESOURCES)
    assert SchedulerConfig().gpu_resource == GPU_RESOURCE
    assert {podspec.GPU_MILLI_ANNOTATION, podspec.GPU_MEMORY_ANNOTATION} == set(SHARE_ANNOTATIONS)


@pytest.mark.parametrize("value", ["1_00", "\u0661\u0660\u0660", "+100", "0", ""])
def test_a_share_the_scheduler_refuses_gets_no_device_on_the_node(value: str) -> None:
    """The node never reads a share's figure (the signed allocation says what a container gets):
    a pod carrying a share annotation, whatever its value, asks for an allocation; the scheduler
    refuses the malformed value, so such a pod only reaches a node unscheduled by kubegpu, and
    the shim refuses it there. Neither side reads "1_00" as 100."""
    from crishim.intercept import Rejected
    from crishim.podlookup import decide, facts_of
    from kubegpu.allocation import SHARE_ANNOTATIONS
    from scheduler.live.podspec import PodSpecError, pod_request

    for key in SHARE_ANNOTATIONS:
        pod = {
            "metadata": {"name": "p", "namespace": "ns", "uid": "u", "annotations": {key: value}},
            "spec": {"containers": [{"name": "app", "image": "x"}]},
        }
        with pytest.raises(PodSpecError, match=key):
            pod_request(pod)
        with pytest.raises(Rejected, match="carries no kubegpu allocation"):
            decide(facts_of(pod, ("nvidia.com/gpu",)))


def test_keys_cli_generates_derives_and_checks(tmp_path: Path) -> None:
    """kubegpu keys: generate a private key, derive the public key the nodes hold, check both dirs."""
    import sys

    def kubegpu(*args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
        command = [sys.executable, "-m", "kubegpu", "keys", *args]
        return subprocess.run(command, input=stdin, capture_output=True)

    scheduler, node = tmp_path / "scheduler", tmp_path / "node"
    scheduler.mkdir()
    node.mkdir()
    assert kubegpu("generate", "--out", str(scheduler / "k1")).returncode == 0
    assert oct((scheduler / "k1").stat().st_mode & 0o777) == "0o600"
    assert kubegpu("generate", "--out", str(scheduler / "k1")).returncode == 2  # never overwrites
    pem = kubegpu("public", str(scheduler / "k1")).stdout
    raw = kubegpu("public", "--format", "base64", "-", stdin=(scheduler / "k1").read_bytes()).stdout
    (node / "k1").write_bytes(pem)
    (node / "k2").write_bytes(raw)
    signer = parse_key((scheduler / "k1").read_bytes())
    assert parse_key(pem) == parse_key(raw) == signer.public_key()  # type: ignore[union-attr]
    ok = kubegpu("check", str(node))
    assert ok.returncode == 0 and json.loads(ok.stdout)["verifying"] == ["k1", "k2"]
    assert kubegpu("check", str(scheduler)).returncode == 1  # a private key where a node reads keys
    assert json.loads(kubegpu("check", "--private", str(scheduler)).stdout)["signing"] == ["k1"]
    bad = kubegpu("public", str(tmp_path / "missing"))
    assert bad.returncode == 2 and len(bad.stderr.decode().strip().splitlines()) == 1


def test_the_annotation_is_written_in_canonical_form() -> None:
    """Compact and sorted, as the canonical form: the smallest value under the size limit."""
    value = sign(example(), "k1", SIGNING["k1"])
    assert value == json.dumps(json.loads(value), sort_keys=True, separators=(",", ":"))
    with pytest.raises(AllocationError, match="invalid key id 'no such/id'"):
        sign(example(), "no such/id", SIGNING["k1"])


def test_a_clean_secret_volume_loads_without_complaint_and_bad_files_skip_alone(tmp_path: Path) -> None:
    data = tmp_path / "..2026_11_26"
    data.mkdir()
    (tmp_path / "..data").symlink_to(data.name)
    (data / "k2").write_bytes(public_key_pem(SIGNING["k2"]))
    (tmp_path / "k2").symlink_to("..data/k2")
    assert load_keys(tmp_path).problems == ()
    (tmp_path / "a-bad").write_bytes(b"junk!")  # sorts before k2
    (tmp_path / "Bad name").write_bytes(b"junk!")
    loaded = load_keys(tmp_path)
    assert set(loaded.public) == {"k2"} and len(loaded.problems) == 2
    assert "is not a directory" in load_keys(tmp_path / "missing").problems[0]


def test_the_key_file_size_limit(tmp_path: Path) -> None:
    from kubegpu.allocation import MAX_KEY_FILE_BYTES

    pem = public_key_pem(SIGNING["k1"])
    (tmp_path / "k1").write_bytes(pem + b" " * (MAX_KEY_FILE_BYTES - len(pem)))
    assert set(load_keys(tmp_path).public) == {"k1"}
    ending = pem.rstrip()  # a file of exactly the limit whose last byte is the key's own: read whole
    (tmp_path / "k1").write_bytes(b" " * (MAX_KEY_FILE_BYTES - len(ending)) + ending)
    assert set(load_keys(tmp_path).public) == {"k1"} and load_keys(tmp_path).problems == ()
    (tmp_path / "k1").write_bytes(pem + b" " * (MAX_KEY_FILE_BYTES + 1 - len(pem)))
    loaded = load_keys(tmp_path)
    assert not loaded.public and loaded.problems == (f"k1: larger than {MAX_KEY_FILE_BYTES} bytes",)


def test_an_unsupported_pem_block_is_named() -> None:
    block = "-----BEGIN ÜBER RSA KEY-----"  # short: the label is this line, not more
    with pytest.raises(KeyFileError) as caught:
        parse_key(f"{block}\nAAAA\n-----END RSA PRIVATE KEY-----\n".encode())
    named = block.encode().decode("ascii", "replace")[:60]
    assert str(caught.value) == f"unsupported PEM block {named!r} (want PRIVATE KEY or PUBLIC KEY)"


def test_a_key_directory_with_subdirectories_and_nothing_else(tmp_path: Path) -> None:
    (tmp_path / "aaa").mkdir()  # a directory with a valid key id name, listed first
    (tmp_path / "k1").write_bytes(public_key_pem(SIGNING["k1"]))
    assert set(load_keys(tmp_path).public) == {"k1"}
    assert load_keys(tmp_path).problems == ("aaa: not a regular file, skipped",)
    missing = load_keys(tmp_path / "missing")
    assert missing.public == {} and missing.private == {} and len(missing.problems) == 1


def test_only_ed25519_keys_and_strict_base64_are_keys() -> None:
    from cryptography.hazmat.primitives.asymmetric import ec

    other = ec.generate_private_key(ec.SECP256R1())
    pem = other.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    with pytest.raises(KeyFileError) as caught:
        parse_key(pem)
    assert str(caught.value) == "not an Ed25519 key but ECPrivateKey"
    loose = b"!" + public_key_base64(SIGNING["k1"]).encode()  # decodes only if junk is ignored
    with pytest.raises(KeyFileError) as caught:
        parse_key(loose)
    assert str(caught.value) == "neither PEM nor base64"


@pytest.mark.parametrize(
    ("patch", "message"),
    [
        ({"version": "one"}, "unsupported allocation version 'one' (this node reads versions 1, 2)"),
        ({"node": None}, "allocation has no node name"),
        ({"podUID": ""}, "allocation has no pod UID"),
        ({"containers": {"Bad": {"devices": ["GPU-a"]}}}, "invalid container name 'Bad'"),
        ({"containers": {"c": []}}, "container c: entry is not an object"),
        ({"containers": {"c": {"devices": []}}}, "container c: no device list"),
        ({"containers": {"c": {"devices": ["GPU-a", "x/y"]}}}, "container c: invalid device id 'x/y'"),
        ({"containers": {"c": {"devices": ["GPU-a"], "shares": []}}}, "container c: shares is not an object"),
        (
            {"containers": {"c": {"devices": ["GPU-a"], "shares": {"GPU-b": {}}}}},
            "container c: share for unlisted device 'GPU-b'",
        ),
        (
            {"containers": {"c": {"devices": ["GPU-a"], "shares": {"GPU-a": 5}}}},
            "container c: share of GPU-a is not an object",
        ),
        (
            {"containers": {"a": {"devices": ["GPU-x"]}, "b": {"devices": ["GPU-x"]}}},
            "device GPU-x is given whole to one of a, b",
        ),
    ],
)
def test_refusals_name_the_problem_exactly(patch: dict, message: str) -> None:
    document = json.loads(sign(example(), "k1", SIGNING["k1"]))
    document.update(patch)
    with pytest.raises(AllocationError) as caught:
        verify(resign(document), KEYS)
    assert str(caught.value) == message


@pytest.mark.parametrize(("milli", "ok"), [(0, False), (1, True), (999, True), (1000, True), (1001, False)])
def test_share_milli_bounds(milli: int, ok: bool) -> None:
    document = json.loads(sign(example(), "k1", SIGNING["k1"]))
    document["containers"]["infer"]["shares"]["GPU-c"]["milli"] = milli
    if ok:
        assert verify(resign(document), KEYS).containers["infer"].shares["GPU-c"].milli == milli
    else:
        with pytest.raises(AllocationError, match="needs milli in 1..1000"):
            verify(resign(document), KEYS)


def test_shares_of_one_device_may_add_up_to_exactly_1000() -> None:
    def pod(a: int, b: int) -> Allocation:
        return Allocation(
            "n",
            "u",
            {
                "0-solo": ContainerAllocation(("GPU-s",)),  # listed once: fine, and checked first
                "a": ContainerAllocation(("GPU-a",), {"GPU-a": Share(a)}),
                "b": ContainerAllocation(("GPU-a",), {"GPU-a": Share(b)}),
            },
        )

    assert verify(sign(pod(600, 400), "k1", SIGNING["k1"]), KEYS) == pod(600, 400)
    document = json.loads(sign(pod(600, 400), "k1", SIGNING["k1"]))
    document["containers"]["b"]["shares"]["GPU-a"]["milli"] = 401
    with pytest.raises(AllocationError, match="add up to more than 1000"):
        verify(resign(document), KEYS)


def test_init_containers_may_reuse_any_device_and_app_containers_may_not() -> None:
    """Regular init containers run alone, before the app containers: they may reuse whole GPUs
    and shares the others hold (and each other's), and never count towards a device's 1000 milli."""

    def verified(containers: dict[str, ContainerAllocation]) -> Allocation:
        allocation = Allocation("n", "u", containers)
        return verify(sign(allocation, "k1", SIGNING["k1"]), KEYS)

    whole = {
        "setup": ContainerAllocation(("GPU-a", "GPU-b"), init=True),
        "warmup": ContainerAllocation(("GPU-a",), init=True),
        "app": ContainerAllocation(("GPU-a",)),
    }
    assert verified(whole).containers == whole
    shares = {
        "setup": ContainerAllocation(("GPU-a",), {"GPU-a": Share(700)}, init=True),
        "a": ContainerAllocation(("GPU-a",), {"GPU-a": Share(600)}),
        "b": ContainerAllocation(("GPU-a",), {"GPU-a": Share(400)}),
    }
    assert verified(shares).containers == shares  # 600 + 400: the init container's 700 not counted
    one_app = {
        "setup": ContainerAllocation(("GPU-a",), init=True),
        "a": ContainerAllocation(("GPU-a",), {"GPU-a": Share(300)}),
    }
    assert verified(one_app).containers == one_app
    # The init flag exempts only the init container: two app containers still may not.
    with pytest.raises(AllocationError, match="device GPU-a is given whole to one of a, b$"):
        verified({"setup": whole["setup"], "a": ContainerAllocation(("GPU-a",)), "b": whole["app"]})
    with pytest.raises(AllocationError, match="shares of device GPU-a add up to more than 1000 milli"):
        verified({**shares, "b": ContainerAllocation(("GPU-a",), {"GPU-a": Share(401)})})
    init_flag = json.loads(sign(Allocation("n", "u", whole), "k1", SIGNING["k1"]))
    init_flag["containers"]["app"]["init"] = "yes"
    with pytest.raises(AllocationError, match="container app: init must be true or false"):
        verify(resign(init_flag), KEYS)


def test_the_key_ring_logs_what_it_loads_once_per_change(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    import logging

    caplog.set_level(logging.DEBUG)
    (tmp_path / "k1").write_bytes(public_key_pem(SIGNING["k1"]))
    (tmp_path / "junk").write_bytes(b"junk!")
    ring = KeyRing(tmp_path, recheck_seconds=0)
    for _ in range(3):
        assert set(ring.keys()) == {"k1"}

    def logged(event: str) -> list[tuple[int, dict]]:
        return [(r.levelno, getattr(r, "fields", {})) for r in caplog.records if r.getMessage() == event]

    assert logged("keys.loaded") == [
        (logging.INFO, {"directory": str(tmp_path), "key_ids": ["k1"], "signing_key_ids": []})
    ]
    assert logged("keys.skipped") == [
        (logging.WARNING, {"directory": str(tmp_path), "problem": "junk: neither PEM nor base64"})
    ]


def test_verify_names_each_refusal_exactly() -> None:
    document = json.loads(sign(example(), "k1", SIGNING["k1"]))
    cases = [
        ("[1]", "annotation is not a JSON object"),
        (json.dumps({**document, "signature": ""}), "annotation is unsigned"),
        (json.dumps({**document, "signature": 5}), "annotation is unsigned"),
        (json.dumps({**document, "keyId": "k9"}), "annotation is signed with unknown key id 'k9'"),
        (
            json.dumps({**document, "signature": "!" + document["signature"]}),
            "annotation signature is not base64",
        ),
        (json.dumps({**document, "containers": {}}), "annotation signature does not verify with key 'k1'"),
    ]
    for value, message in cases:
        with pytest.raises(AllocationError) as caught:
            verify(value, KEYS)
        assert str(caught.value) == message, value
    with pytest.raises(AllocationError) as caught:
        verify("{", KEYS)
    assert str(caught.value).startswith("annotation is not JSON: ")
    exactly = "x" * MAX_ANNOTATION_BYTES  # at the limit: too big only one byte later
    with pytest.raises(AllocationError, match="not JSON"):
        verify(exactly, KEYS)
    with pytest.raises(AllocationError, match="more than"):
        verify(exactly + "x", KEYS)
    document["containers"] = {}
    with pytest.raises(AllocationError) as caught:
        verify(resign(document), KEYS)
    assert str(caught.value) == "allocation has no containers"


def test_sixty_four_containers_are_allowed() -> None:
    allocation = Allocation("n", "u", {f"c{i}": ContainerAllocation((f"GPU-{i}",)) for i in range(64)})
    assert verify(sign(allocation, "k1", SIGNING["k1"]), KEYS) == allocation


def test_the_canonical_form_is_ascii_json_with_sorted_keys() -> None:
    """A fixed vector: another implementation of the contract must produce these bytes."""
    document = {
        "version": 1,
        "node": "nöde",
        "signature": "dropped",
        "keyId": "k1",
        "a": [1, {"z": 1, "b": 2}],
    }
    assert (
        canonical_bytes(document) == b'{"a":[1,{"b":2,"z":1}],"keyId":"k1","node":"n\\u00f6de","version":1}'
    )


def test_a_ring_without_a_directory_or_keys() -> None:
    ring = KeyRing(None)
    assert ring.keys() == {} and ring.signing_key("k1") is None


def test_a_key_ring_uses_no_private_key_unless_told_to(tmp_path: Path) -> None:
    """The shim's ring is built with the defaults: a private key file there must not count."""
    (tmp_path / "k1").write_bytes(private_key_pem(SIGNING["k1"]))
    ring = KeyRing(tmp_path, recheck_seconds=0)
    assert ring.keys() == {} and ring.signing_key("k1") is None


def _deep_at(frames: int, call):  # type: ignore[no-untyped-def]
    return call() if frames == 0 else _deep_at(frames - 1, call)


@pytest.mark.parametrize("frames", [0, 40, 200])
def test_nesting_at_the_parsers_limit_is_a_clean_refusal(frames: int) -> None:
    """A depth that json.loads just manages must not make the canonical form's json.dumps raise
    RecursionError (an INTERNAL error in the shim): every depth is an AllocationError. ``frames``
    stands for how deep in its stack the shim calls verify."""
    signature = base64.b64encode(bytes(64)).decode()
    for depth in range(400, 1100):
        value = '{"keyId":"k1","signature":"' + signature + '","x":' + "[" * depth + "1" + "]" * depth + "}"
        with pytest.raises(AllocationError):
            _deep_at(frames, lambda v=value: verify(v, KEYS))


def test_the_nesting_limit_is_exact() -> None:
    document = example().to_document()
    document["extra"] = json.loads("[" * 31 + "]" * 31)  # 1 (the document) + 31 = 32 deep
    assert verify(resign(document), KEYS) == example()
    document["extra"] = json.loads("[" * 32 + "]" * 32)  # 33 deep
    with pytest.raises(AllocationError, match="more than 32 deep"):
        verify(resign(document), KEYS)


@pytest.mark.parametrize("private", [True, False])
def test_a_key_of_an_unknown_algorithm_is_skipped_alone(tmp_path: Path, private: bool) -> None:
    """cryptography raises UnsupportedAlgorithm (not a ValueError) for it: one such file must not
    make the whole directory unreadable, nor the CLI fail with a traceback."""
    import sys

    from tests.fixtures.keys import unknown_algorithm_pem

    with pytest.raises(KeyFileError, match="1.2.3.4"):
        parse_key(unknown_algorithm_pem(private))
    (tmp_path / "k1").write_bytes(public_key_pem(SIGNING["k1"]))
    (tmp_path / "k2").write_bytes(unknown_algorithm_pem(private))
    loaded = load_keys(tmp_path)
    assert set(loaded.public) == {"k1"} and len(loaded.problems) == 1 and "k2" in loaded.problems[0]
    assert set(KeyRing(tmp_path).keys()) == {"k1"}
    command = [sys.executable, "-m", "kubegpu", "keys"]
    public = subprocess.run([*command, "public", str(tmp_path / "k2")], capture_output=True)
    assert public.returncode == 2 and len(public.stderr.decode().strip().splitlines()) == 1
    check = subprocess.run([*command, "check", str(tmp_path)], capture_output=True)
    assert check.returncode == 1 and json.loads(check.stdout)["verifying"] == ["k1"]


def test_a_key_directory_that_goes_away_while_being_read_is_no_keys(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The directory is removed (or swapped for a symlink) between the check that it is one and
    the listing: the ring has no keys until it is back, and says why; nothing raises."""
    (tmp_path / "k1").write_bytes(public_key_pem(SIGNING["k1"]))
    ring = KeyRing(tmp_path, recheck_seconds=0)
    assert set(ring.keys()) == {"k1"}

    def vanished(self: Path):  # type: ignore[no-untyped-def]
        raise FileNotFoundError(2, "No such file or directory", str(self))

    monkeypatch.setattr(Path, "iterdir", vanished)
    loaded = load_keys(tmp_path)
    assert loaded.public == {} and "No such file or directory" in loaded.problems[0]
    (tmp_path / "k2").write_bytes(public_key_pem(SIGNING["k2"]))  # a change: the ring re-reads
    assert ring.keys() == {}
    monkeypatch.undo()
    (tmp_path / "k2").unlink()
    assert set(ring.keys()) == {"k1"}


def test_keys_public_reads_no_more_than_a_key_file_can_hold() -> None:
    """``kubegpu keys public /dev/zero`` (or any endless file) is one stderr line and exit 2, not
    a process reading until memory runs out (here capped at 1 GiB, so that it cannot hurt)."""
    import resource
    import sys

    def cap() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))

    done = subprocess.run(
        [sys.executable, "-m", "kubegpu", "keys", "public", "/dev/zero"],
        capture_output=True,
        preexec_fn=cap,
        timeout=120,
    )
    assert done.returncode == 2, done.stderr.decode()[-500:]
    assert done.stderr.decode().strip().splitlines() == [
        "kubegpu keys public: /dev/zero: is a device, not a regular file"  # refused unread
    ]


def test_a_key_directory_replaced_by_a_symlink_is_followed(tmp_path: Path) -> None:
    """The directory is swapped for a symlink to another one holding the same file names (other
    keys), then the link is re-pointed, then a key file is chmod 000 (root still reads it)."""
    first, second, ring_dir = tmp_path / "first", tmp_path / "second", tmp_path / "keys"
    write_dir = {first: "k1", second: "k2"}
    for directory, key_id in write_dir.items():
        directory.mkdir()
        (directory / "k1").write_bytes(public_key_pem(SIGNING[key_id]))
    ring_dir.mkdir()
    (ring_dir / "k1").write_bytes(public_key_pem(SIGNING["k1"]))
    ring = KeyRing(ring_dir, recheck_seconds=0)
    assert ring.keys()["k1"] == KEYS["k1"]
    (ring_dir / "k1").unlink()
    ring_dir.rmdir()
    ring_dir.symlink_to(second)
    assert ring.keys()["k1"] == KEYS["k2"]
    swap = tmp_path / "swap"
    swap.symlink_to(first)
    swap.rename(ring_dir)
    assert ring.keys()["k1"] == KEYS["k1"]
    os.chmod(first / "k1", 0)
    assert set(ring.keys()) == ({"k1"} if os.geteuid() == 0 else set())


# ------------------------------------------------------------------- who may change the keys

NOBODY = 65534  # another local user: the tests run as root and hand files to it with chown


def trusted_keys(directory: Path) -> Path:
    """A key directory (0755) with k1 and k2 (0644), all root's, under ``directory`` (0755)."""
    directory.chmod(0o755)
    keys = directory / "keys"
    keys.mkdir(mode=0o755)
    for key_id in ("k1", "k2"):
        (keys / key_id).write_bytes(public_key_pem(SIGNING[key_id]))
    return keys


@pytest.mark.parametrize("owner", [1, NOBODY])
def test_a_key_file_anyone_but_root_can_change_is_skipped_alone(tmp_path: Path, owner: int) -> None:
    keys = trusted_keys(tmp_path)
    assert load_keys(keys).public == KEYS and load_keys(keys).problems == ()
    os.chown(keys / "k1", owner, 0)
    loaded = load_keys(keys)
    assert set(loaded.public) == {"k2"}
    assert loaded.problems == (f"k1: {keys / 'k1'} is owned by uid {owner}, not root",)
    os.chown(keys / "k1", 0, 0)
    (keys / "k1").chmod(0o664)
    assert load_keys(keys).problems == (f"k1: {keys / 'k1'} is writable by its group (mode 0664)",)
    (keys / "k1").chmod(0o646)
    assert load_keys(keys).problems == (f"k1: {keys / 'k1'} is writable by others (mode 0646)",)
    assert set(load_keys(keys).public) == {"k2"}


@pytest.mark.parametrize("where", ["keys", "parent"])
@pytest.mark.parametrize("how", ["owner", "mode"])
def test_a_key_directory_anyone_but_root_can_change_gives_no_key(
    tmp_path: Path, where: str, how: str
) -> None:
    """Whoever can write the directory (or one above it) can plant a key or swap the directory:
    none of its keys is used."""
    keys = trusted_keys(tmp_path)
    weak = keys if where == "keys" else tmp_path
    if how == "owner":
        os.chown(weak, NOBODY, 0)
        why = f"{weak} is owned by uid {NOBODY}, not root"
    else:
        weak.chmod(0o777)
        why = f"{weak} is writable by its group and others (mode 0777)"
    loaded = load_keys(keys)
    assert loaded.public == {} and loaded.private == {}
    assert loaded.problems == (f"{keys}: no key used, the directory is not root's alone: {why}",)


def test_a_sticky_directory_of_root_loads_but_planted_entries_are_skipped(tmp_path: Path) -> None:
    """A Secret volume's root is a tmpfs of mode 1777: anyone may add an entry, nobody may replace
    root's. Keys root wrote load; what another user adds there (a file, a symlink to a key file of
    root's, a symlink into a directory of its own) is skipped."""
    keys = trusted_keys(tmp_path)
    keys.chmod(0o1777)
    data = keys / "..2026_11_26"
    data.mkdir(mode=0o755)
    (data / "k3").write_bytes(public_key_pem(SIGNING["k1"]))
    (keys / "..data").symlink_to(data.name)
    (keys / "k3").symlink_to("..data/k3")
    assert set(load_keys(keys).public) == {"k1", "k2", "k3"} and load_keys(keys).problems == ()
    planted = keys / "k4"
    planted.write_bytes(public_key_pem(SIGNING["k2"]))
    os.chown(planted, NOBODY, NOBODY)
    link = keys / "k5"
    link.symlink_to("k1")
    os.chown(link, NOBODY, NOBODY, follow_symlinks=False)
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o755)
    (theirs / "k6").write_bytes(public_key_pem(SIGNING["k1"]))
    os.chown(theirs, NOBODY, NOBODY)
    (keys / "k6").symlink_to(theirs / "k6")
    loaded = load_keys(keys)
    assert set(loaded.public) == {"k1", "k2", "k3"}
    assert loaded.problems == (
        f"k4: {planted} is owned by uid {NOBODY}, not root",
        f"k5: {link} is a symlink owned by uid {NOBODY}, not root",
        f"k6: {theirs} is owned by uid {NOBODY}, not root",
    )


def test_a_ring_uses_no_key_once_its_directory_is_open_to_others(tmp_path: Path) -> None:
    """The shim's ring: after the directory became writable by others and a key was planted, no key
    verifies (allocations are refused), the planted one least; with the mode fixed, the keys are back."""
    keys = trusted_keys(tmp_path)
    ring = KeyRing(keys, recheck_seconds=0)
    assert ring.keys() == KEYS
    keys.chmod(0o777)
    (keys / "k9").write_bytes(public_key_pem(SIGNING["k1"]))
    assert ring.keys() == {}
    (keys / "k9").unlink()
    keys.chmod(0o755)
    assert ring.keys() == KEYS
    tmp_path.chmod(0o775)  # an ancestor: nothing inside the key directory changes
    assert ring.keys() == {}
    tmp_path.chmod(0o755)
    assert ring.keys() == KEYS


def test_every_reason_a_key_directory_is_not_roots_alone_is_named(tmp_path: Path) -> None:
    keys = trusted_keys(tmp_path)
    keys.chmod(0o757)
    os.chown(tmp_path, NOBODY, 0)
    loaded = load_keys(keys)
    assert loaded.public == {}
    assert loaded.problems == (
        f"{keys}: no key used, the directory is not root's alone: {keys} is writable by others "
        f"(mode 0757); {tmp_path} is owned by uid {NOBODY}, not root",
    )


def test_a_key_directory_reached_through_someone_elses_symlink_gives_no_key(tmp_path: Path) -> None:
    """Whoever owns a symlink on the way can re-point it at a directory of their own keys."""
    keys = trusted_keys(tmp_path)
    link = tmp_path / "via"
    link.symlink_to(keys)
    os.chown(link, NOBODY, NOBODY, follow_symlinks=False)
    loaded = load_keys(link)
    assert loaded.public == {}
    assert loaded.problems == (
        f"{link}: no key used, the directory is not root's alone: {link} is a symlink owned by uid "
        f"{NOBODY}, not root",
    )
    os.chown(link, 0, 0, follow_symlinks=False)
    assert load_keys(link).public == KEYS and load_keys(link).problems == ()


def test_a_key_directory_is_checked_where_its_symlink_leads_too(tmp_path: Path) -> None:
    """The directories above the real key directory count, not only those above its link."""
    tmp_path.chmod(0o755)
    loose = tmp_path / "loose"
    loose.mkdir()
    loose.chmod(0o777)
    real = trusted_keys(loose)
    loose.chmod(0o777)  # trusted_keys made it 0755
    link = tmp_path / "keys"
    link.symlink_to(real)
    loaded = load_keys(link)
    assert loaded.public == {}
    assert loaded.problems == (
        f"{link}: no key used, the directory is not root's alone: {loose} is writable by its group "
        "and others (mode 0777)",
    )


def test_the_trust_check_below_an_install_root_stops_at_that_root(tmp_path: Path) -> None:
    """``kubegpu node install --root R`` checks what it writes under R up to, not including, R
    (``path_problems(path, below=R)``), as spelled and as resolved; without a root every directory
    above counts. A directory that does not exist yet is skipped, not the ones above it."""
    tmp_path.chmod(0o755)
    loose = tmp_path / "loose"
    loose.mkdir()
    loose.chmod(0o777)
    root = loose / "root"
    etc = root / "etc"
    keys = etc / "keys"
    keys.mkdir(parents=True)
    for directory in (root, etc, keys):
        directory.chmod(0o755)
    above = f"{loose} is writable by its group and others (mode 0777)"
    assert path_problems(keys) == [above]
    assert path_problems(loose / "not-yet" / "keys") == [above]
    assert path_problems(keys, below=root) == []
    link = tmp_path / "link"
    link.symlink_to(root)
    assert path_problems(link / "etc" / "keys", below=link) == []
    etc.chmod(0o775)
    inside = f"{etc} is writable by its group (mode 0775)"
    assert path_problems(keys, below=root) == [inside]
    assert path_problems(link / "etc" / "keys", below=link) == [
        f"{link / 'etc'} is writable by its group (mode 0775)"
    ]


def test_a_key_file_removed_while_the_directory_is_read_is_skipped_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    keys = trusted_keys(tmp_path)
    listed = sorted(keys.iterdir())  # the listing still has k2 ...
    (keys / "k2").unlink()  # ... removed before it is read
    monkeypatch.setattr(Path, "iterdir", lambda self: iter(listed))
    loaded = load_keys(keys)
    assert set(loaded.public) == {"k1"} and loaded.problems == ("k2: No such file or directory",)


def test_a_key_file_swapped_for_a_fifo_after_its_check_is_refused_unread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The entry was a regular file when checked and is a FIFO when opened: the open file is
    checked again, and refused. (A writer holds the FIFO open, so no open of it can block here.)"""
    keys = trusted_keys(tmp_path)
    (keys / "k2").unlink()
    os.mkfifo(keys / "k2")
    writer = os.open(keys / "k2", os.O_RDWR | os.O_NONBLOCK)
    try:
        with monkeypatch.context() as patch:
            patch.setattr(Path, "is_file", lambda self: True)  # what the check saw
            loaded = load_keys(keys)
    finally:
        os.close(writer)
    assert set(loaded.public) == {"k1"} and loaded.problems == ("k2: not a regular file",)
