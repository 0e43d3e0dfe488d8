"""Kubernetes API client construction shared by the node agent and the scheduler."""

from __future__ import annotations

import os

from kubernetes import client, config


def api_client(kubeconfig: str | None) -> client.ApiClient | None:
    """A client from ``kubeconfig``, else the in-cluster service account, else None."""
    if kubeconfig:
        return config.new_client_from_config(config_file=kubeconfig)
    if os.environ.get("KUBERNETES_SERVICE_HOST"):
        configuration = client.Configuration()
        config.load_incluster_config(client_configuration=configuration)
        return client.ApiClient(configuration)
    return None
