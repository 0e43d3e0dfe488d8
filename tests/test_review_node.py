"""Hostile review of the node agent's issue #20 changes: defects found and their regression tests.

Real containerd where the defect shows at that boundary (the shim in front of the session's
containerd, as in test_crishim_rewrite.py), stand-ins where the ledger alone decides.
"""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import grpc
import pytest

from crishim.cri import api_pb2
from crishim.intercept import Rejected
from crishim.ledger import MARK_ANNOTATION, mark_value
from crishim.rewrite import AllocationRewriter
from kubegpu.allocation import KeyRing
from tests.fixtures.keys import SIGNING as LIFE_SIGNING
from tests.test_crishim_lifecycle import NODE as LIFE_NODE
from tests.test_crishim_lifecycle import FakeRuntime, request, rewriter_on_fake_runtime, sim_node
from tests.test_crishim_rewrite import Node, gpu, late_container, node  # noqa: F401 - the fixture
from tests.test_node_install import run, tree

# --- a shim restart forgets the over-booking it refused ---------------------------------------


def _running(
    container_id: str, sandbox: str, pod_uid: str, name: str, devices: dict[str, int]
) -> api_pb2.Container:
    return api_pb2.Container(
        id=container_id,
        pod_sandbox_id=sandbox,
        metadata=api_pb2.ContainerMetadata(name=name),
        state=api_pb2.CONTAINER_RUNNING,
        annotations={MARK_ANNOTATION: mark_value(pod_uid, name, devices)},
    )


def test_a_rebuild_never_books_a_device_past_its_capacity(tmp_path: Path) -> None:
    """Q's container runs on GPU-0; P's late container for GPU-0 (created, never started) was
    refused adoption. The shim restarts: its rebuild must not book both (2000 milli), and P's
    container must still not start with Q's GPU; Q's keeps it."""
    rewriter = AllocationRewriter(LIFE_NODE, sim_node(tmp_path), KeyRing(None, LIFE_SIGNING))
    runtime = FakeRuntime()
    runtime.sandbox_uids["sq"] = "Q"
    runtime.add("c-late", "sb", "app", 0, {"GPU-0": 1000})  # created, listed first
    runtime.containers.append(_running("c-q", "sq", "Q", "c", {"GPU-0": 1000}))
    rewriter._runtime = runtime  # type: ignore[assignment]
    asyncio.run(rewriter.rebuild())
    on_gpu0 = [(h.container_id, h.milli) for h in rewriter.ledger.holdings() if h.device == "GPU-0"]
    assert on_gpu0 == [("c-q", 1000)]
    with pytest.raises(Rejected) as start:
        rewriter.start_container("c-late")
    assert "not its own" in str(start.value)
    rewriter.start_container("c-q")


@pytest.mark.containerd
def test_a_refused_late_container_stays_refused_across_a_shim_restart(node: Node) -> None:  # noqa: F811
    """Real containerd: P's late container for Q's GPU is refused adoption and refused its start;
    after the shim restarts, it must still not start (the rebuild booked it beside Q's)."""
    device = gpu(3)
    p_uid, q_uid, r_uid = (str(uuid.uuid4()) for _ in range(3))
    p_sandbox, p_config = node.run_pod("rb-p", node.signed(p_uid, {"app": [device]}), p_uid)
    q_sandbox, q_config = node.run_pod("rb-q", node.signed(q_uid, {"app": [device]}), q_uid)
    r_sandbox, r_config = node.run_pod("rb-r", node.signed(r_uid, {"app": [gpu(4)]}), r_uid)
    q_container = node.create(q_sandbox, q_config, "app")
    node.client.runtime.StartContainer(api_pb2.StartContainerRequest(container_id=q_container), timeout=60)
    late = late_container(node, p_sandbox, p_config, p_uid, device, 1000)
    node.create(r_sandbox, r_config, "app")  # an adoption pass: P's container is refused
    with pytest.raises(grpc.RpcError) as start:
        node.client.runtime.StartContainer(api_pb2.StartContainerRequest(container_id=late), timeout=60)
    assert start.value.code() is grpc.StatusCode.FAILED_PRECONDITION, start.value.details()
    node.restart_shim(kill=True)
    with pytest.raises(grpc.RpcError) as again:
        node.client.runtime.StartContainer(api_pb2.StartContainerRequest(container_id=late), timeout=60)
    assert again.value.code() is grpc.StatusCode.FAILED_PRECONDITION, again.value.details()
    status = node.direct.runtime.ContainerStatus(api_pb2.ContainerStatusRequest(container_id=late))
    assert status.status.state == api_pb2.CONTAINER_CREATED


# --- a create that completes after its sandbox was removed ------------------------------------


def test_a_create_completing_after_its_sandbox_went_is_not_booked_past_capacity(tmp_path: Path) -> None:
    """P's create of GPU-0 is in flight when P's sandbox is stopped and removed (containerd checks
    the sandbox only when a create starts, so it can still finish it): the removal frees P's
    holding and Q gets GPU-0. When P's create then answers with its container, the shim must not
    book it beside Q's (2000 milli), nor let it start."""
    rewriter, runtime = rewriter_on_fake_runtime(tmp_path)
    runtime.sandbox_uids["sq"] = "Q"

    async def run() -> None:
        _, p_done = await rewriter.create_container(request(grant={"app": ["GPU-0"]}))
        rewriter.removed_sandbox("sb")
        _, q_done = await rewriter.create_container(
            request(container="c", grant={"c": ["GPU-0"]}, uid="Q", sandbox="sq")
        )
        q_done("c-q", False)  # type: ignore[misc]
        p_done("c-p", False)  # type: ignore[misc]

    asyncio.run(run())
    on_gpu0 = [(h.container_id, h.milli) for h in rewriter.ledger.holdings() if h.device == "GPU-0"]
    assert on_gpu0 == [("c-q", 1000)]
    with pytest.raises(Rejected):
        rewriter.start_container("c-p")
    rewriter.start_container("c-q")


# --- an install record of the wrong shape -------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    ['{"settings": [], "files": {}}', '{"settings": "x", "files": {}}', "[" * 100_000],
    ids=["settings-list", "settings-string", "deep"],
)
def test_uninstall_says_a_record_of_the_wrong_shape_is_unreadable(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, text: str
) -> None:
    """A damaged record is refused as unreadable, naming it and the way out, like any other bad
    record, and nothing is removed (it was an 'unexpected AttributeError/RecursionError')."""
    (tmp_path / "etc/kubegpu").mkdir(parents=True)
    (tmp_path / "etc/kubegpu/node-install.json").write_text(text)
    before = tree(tmp_path)
    code, out, err = run(capsys, monkeypatch, "node", "uninstall", "--root", str(tmp_path))
    assert code == 1, (out, err)
    assert "node-install.json is unreadable" in err and "unexpected" not in err, err
    assert tree(tmp_path) == before


def test_a_create_and_its_ambiguous_retry_count_once_for_other_pods() -> None:
    """Under load kubelet's create of P runs past its deadline and its retry fails ambiguously too
    ("name is reserved": containerd is still making the first). Both holdings are quarantined, but
    containerd makes at most one container per pod, name and attempt: P's 600 count once and Q's
    400 fit (counted twice, Q was refused: tests/test_crishim_rewrite.py's deadline test failed
    under load)."""
    from crishim.ledger import Holding, Ledger

    ledger = Ledger()
    first = Holding("", "sb-p", "p", "app", "gpu0", 600, attempt=0, ticket=1)
    retry = Holding("", "sb-p", "p", "app", "gpu0", 600, attempt=0, ticket=2)
    assert ledger.try_reserve([first]) == []
    ledger.mark_unknown([first])
    assert ledger.try_reserve([retry]) == []
    ledger.mark_unknown([retry])
    q = Holding("", "sb-q", "q", "app", "gpu0", 400, ticket=3)
    assert ledger.try_reserve([q]) == []
    too_much = Holding("", "sb-r", "r", "app", "gpu0", 1, ticket=4)
    assert ledger.try_reserve([too_much])  # 600 + 400 + 1: refused
    other_attempt = Holding("", "sb-p", "p", "app", "gpu1", 600, attempt=0, ticket=5)
    next_attempt = Holding("", "sb-p", "p", "app", "gpu1", 600, attempt=1, ticket=6)
    for h in (other_attempt, next_attempt):
        assert ledger.try_reserve([h]) == []
        ledger.mark_unknown([h])
    # two attempts may both end up as containers: they count twice for anyone else
    assert ledger.try_reserve([Holding("", "sb-s", "s", "app", "gpu1", 100, ticket=7)])
