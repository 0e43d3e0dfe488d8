"""Pod sandboxes a test made through CRI, and their removal (each container with its sandbox)."""

from __future__ import annotations

from crishim.cri import api_pb2
from kubegpu.devenv.cri import CriClient


def remove_sandbox(client: CriClient, sandbox: str, timeout: float | None = 60) -> None:
    """Stop and remove the pod sandbox ``sandbox`` (its containers with it)."""
    client.runtime.StopPodSandbox(api_pb2.StopPodSandboxRequest(pod_sandbox_id=sandbox), timeout=timeout)
    client.runtime.RemovePodSandbox(api_pb2.RemovePodSandboxRequest(pod_sandbox_id=sandbox), timeout=timeout)


def sandbox_ids(client: CriClient) -> set[str]:
    """The ids of the pod sandboxes the runtime behind ``client`` has now."""
    return {s.id for s in client.runtime.ListPodSandbox(api_pb2.ListPodSandboxRequest()).items}


def remove_sandboxes_since(client: CriClient, before: set[str], timeout: float | None = None) -> None:
    """Remove every pod sandbox that is not one of ``before``: what a test left behind."""
    for sandbox in client.runtime.ListPodSandbox(api_pb2.ListPodSandboxRequest()).items:
        if sandbox.id not in before:
            remove_sandbox(client, sandbox.id, timeout)
