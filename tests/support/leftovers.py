"""What of kubegpu's is left in a cluster: every object of the kinds an install creates that
carries a label selector (``app.kubernetes.io/part-of=kubegpu`` by default).

A namespace that is Terminating counts as gone (its objects go with it; a test control plane
without a namespace controller never finishes the deletion).
"""

from __future__ import annotations

from kubernetes import client as k8s

PART_OF = "app.kubernetes.io/part-of=kubegpu"


def labelled(api: k8s.ApiClient, selector: str = PART_OF) -> list[str]:
    """``Kind/[namespace/]name`` of every matching object, sorted."""
    core, rbac = k8s.CoreV1Api(api), k8s.RbacAuthorizationV1Api(api)
    listings = {
        "Namespace": core.list_namespace,
        "ClusterRole": rbac.list_cluster_role,
        "ClusterRoleBinding": rbac.list_cluster_role_binding,
        "Role": rbac.list_role_for_all_namespaces,
        "RoleBinding": rbac.list_role_binding_for_all_namespaces,
        "ServiceAccount": core.list_service_account_for_all_namespaces,
        "Secret": core.list_secret_for_all_namespaces,
        "ConfigMap": core.list_config_map_for_all_namespaces,
        "Service": core.list_service_for_all_namespaces,
        "Pod": core.list_pod_for_all_namespaces,
        "Deployment": k8s.AppsV1Api(api).list_deployment_for_all_namespaces,
        "ReplicaSet": k8s.AppsV1Api(api).list_replica_set_for_all_namespaces,
        "PodDisruptionBudget": k8s.PolicyV1Api(api).list_pod_disruption_budget_for_all_namespaces,
        "Lease": k8s.CoordinationV1Api(api).list_lease_for_all_namespaces,
    }
    found = []
    for kind, lister in listings.items():
        for item in lister(label_selector=selector).items:
            if kind == "Namespace" and item.status.phase == "Terminating":
                continue
            where = f"{item.metadata.namespace}/" if item.metadata.namespace else ""
            found.append(f"{kind}/{where}{item.metadata.name}")
    return sorted(found)
