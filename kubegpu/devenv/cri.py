"""A small CRI client (what kubelet does), for tests, benchmarks and the demo."""

from __future__ import annotations

from dataclasses import dataclass

import grpc

from crishim.cri import api_pb2, api_pb2_grpc

MAX_MESSAGE = 16 * 1024 * 1024  # kubelet's limit


@dataclass
class CriClient:
    """RuntimeService and ImageService stubs on one channel to a unix-socket endpoint."""

    endpoint: str

    def __post_init__(self) -> None:
        target = self.endpoint.replace("unix://", "unix:", 1)
        self.channel = grpc.insecure_channel(
            target,
            options=[
                ("grpc.max_receive_message_length", MAX_MESSAGE),
                ("grpc.max_send_message_length", MAX_MESSAGE),
            ],
        )
        self.runtime = api_pb2_grpc.RuntimeServiceStub(self.channel)
        self.images = api_pb2_grpc.ImageServiceStub(self.channel)

    def close(self) -> None:
        self.channel.close()


def host_network_sandbox(
    name: str,
    uid: str,
    namespace: str = "default",
    log_directory: str = "",
    annotations: dict[str, str] | None = None,
) -> api_pb2.PodSandboxConfig:
    """A pod sandbox config on the host network (no CNI needed), as kubelet would send it."""
    return api_pb2.PodSandboxConfig(
        metadata=api_pb2.PodSandboxMetadata(name=name, uid=uid, namespace=namespace, attempt=0),
        log_directory=log_directory,
        labels={
            "io.kubernetes.pod.name": name,
            "io.kubernetes.pod.namespace": namespace,
            "io.kubernetes.pod.uid": uid,
        },
        annotations=annotations or {},
        linux=api_pb2.LinuxPodSandboxConfig(
            security_context=api_pb2.LinuxSandboxSecurityContext(
                namespace_options=api_pb2.NamespaceOption(network=api_pb2.NODE),
            ),
        ),
    )


def shell_container(
    name: str, image: str, script: str, log_path: str = "", envs: dict[str, str] | None = None
) -> api_pb2.ContainerConfig:
    """A container that runs ``sh -c script`` in ``image``."""
    return api_pb2.ContainerConfig(
        metadata=api_pb2.ContainerMetadata(name=name, attempt=0),
        image=api_pb2.ImageSpec(image=image),
        command=["/bin/sh", "-c", script],
        envs=[api_pb2.KeyValue(key=k, value=v.encode()) for k, v in (envs or {}).items()],
        log_path=log_path,
        labels={"io.kubernetes.container.name": name},
    )
