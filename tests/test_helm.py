"""The Helm chart deploy/helm/kubegpu: lint, no drift from deploy/, accepted by the real apiserver
(server-side dry run), values mapped onto the scheduler config, and the signing key's life
(generated on install, kept on upgrade, gone on uninstall) with `helm` against a real apiserver.

The install/upgrade/uninstall tests here run against a private control plane (no kubelet: the
pods never start); tests/test_helm_node.py runs the chart on the real node.
"""

from __future__ import annotations

import base64
import copy
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client as k8s

from kubegpu import __version__
from kubegpu.allocation import SigningKey, parse_key
from kubegpu.devenv.controlplane import ControlPlane, ensure_namespace
from kubegpu.devenv.manifests import Discovery, ManifestError, apply_manifests, iter_objects, load_documents
from scheduler.live.config import load_config
from tests.fixtures.helm import CHART, Helm
from tests.support.leftovers import labelled
from tests.support.waiting import wait_for

DEPLOY = CHART.parents[1]
SECRET_TEMPLATE = DEPLOY / "allocation-keys.secret.yaml.template"
HELM_LABELS = (
    "app.kubernetes.io/managed-by",
    "app.kubernetes.io/instance",
    "app.kubernetes.io/version",
    "helm.sh/chart",
)


def render(helm: Helm, *values: str, release: str = "kubegpu") -> list[dict[str, Any]]:
    """``helm template`` with ``--set`` values; the objects it prints."""
    args = ["template", release, str(CHART)]
    for value in values:
        args += ["--set", value]
    return load_documents(helm(*args).stdout)


def by_key(objects: list[dict[str, Any]]) -> dict[tuple[str, str, str], dict[str, Any]]:
    return {(o["kind"], o["metadata"].get("namespace", ""), o["metadata"]["name"]): o for o in objects}


def without_helm_bookkeeping(obj: dict[str, Any]) -> dict[str, Any]:
    """The object less what only Helm adds: its labels, the config checksum, the parsed config."""
    obj = copy.deepcopy(obj)
    metas = [obj["metadata"]]
    if obj["kind"] == "Deployment":
        metas.append(obj["spec"]["template"]["metadata"])
        metas[-1].get("annotations", {}).pop("checksum/config", None)
    for meta in metas:
        for label in HELM_LABELS:
            meta.get("labels", {}).pop(label, None)
    if obj["kind"] == "ConfigMap":
        obj["data"] = {k: yaml.safe_load(v) for k, v in obj["data"].items()}
    return obj


def test_lint(helm: Helm) -> None:
    for values in (
        [],
        ["signingKey.algorithm=ed25519"],
        ["signingKey.existingSecret=mine"],
        ["metrics.serviceMonitor.enabled=true", "namespace.create=false"],
        ["scheduler.extender.enabled=true", "scheduler.extender.tlsSecret=extender-tls"],
    ):
        args = [arg for value in values for arg in ("--set", value)]
        result = helm("lint", "--strict", str(CHART), *args)
        assert "1 chart(s) linted, 0 chart(s) failed" in result.stdout


def test_chart_version_follows_the_project() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["appVersion"] == chart["version"] == __version__


def test_defaults_render_deploy(helm: Helm) -> None:
    """No drift: the chart's defaults are deploy/'s objects (less Helm's labels), plus the Secret
    that deploy/ ships only as a template."""
    chart = by_key(render(helm))
    plain = by_key(list(iter_objects([DEPLOY])))
    secret_key = ("Secret", "kubegpu-system", "kubegpu-allocation-keys")
    secret = chart.pop(secret_key)
    assert set(chart) == set(plain)
    for key, obj in plain.items():
        assert without_helm_bookkeeping(chart[key]) == without_helm_bookkeeping(obj), key
    template = yaml.safe_load(SECRET_TEMPLATE.read_text())
    assert without_helm_bookkeeping(secret)["metadata"] == template["metadata"]
    assert secret["type"] == template["type"]
    assert set(secret["data"]) == set(template["data"]) == {"k1"}
    assert isinstance(parse_key(base64.b64decode(secret["data"]["k1"])), SigningKey)
    # the image deploy/ and the chart run is the one `make image` builds
    container = plain[("Deployment", "kubegpu-system", "kubegpu-scheduler")]["spec"]["template"]["spec"][
        "containers"
    ][0]
    assert container["image"] == f"kubegpu:{__version__}"


def test_values_map_onto_the_scheduler(helm: Helm, tmp_path: Path) -> None:
    objects = by_key(
        render(
            helm,
            "namespace.name=gpu-sched",
            "scheduler.replicas=3",
            "scheduler.config.policy=binpack",
            "scheduler.config.leaderElection.leaseName=sched-lease",
            "scheduler.config.signingKeyId=k7",
            "scheduler.config.bindWorkers=4",
            "scheduler.metricsPort=9999",
            "image.repository=reg.example/kubegpu",
            "image.tag=9.9",
            "scheduler.resources.limits.memory=2Gi",
            "scheduler.podDisruptionBudget.enabled=false",
            "signingKey.existingSecret=my-keys",
        )
    )
    config_text = objects[("ConfigMap", "gpu-sched", "kubegpu-scheduler-config")]["data"]["scheduler.yaml"]
    path = tmp_path / "scheduler.yaml"
    path.write_text(config_text)
    config = load_config(path)  # the scheduler's own loader accepts every key
    assert (config.policy, config.signing_key_id, config.bind_workers) == ("binpack", "k7", 4)
    assert config.metrics_address == "0.0.0.0:9999"
    assert config.keys_dir == "/etc/kubegpu/keys"
    assert (config.leader_election.namespace, config.leader_election.lease_name) == (
        "gpu-sched",
        "sched-lease",
    )
    role = objects[("Role", "gpu-sched", "kubegpu-scheduler-leader")]
    assert role["rules"][1]["resourceNames"] == ["sched-lease"]
    deployment = objects[("Deployment", "gpu-sched", "kubegpu-scheduler")]
    pod = deployment["spec"]["template"]
    container = pod["spec"]["containers"][0]
    assert deployment["spec"]["replicas"] == 3
    assert container["image"] == "reg.example/kubegpu:9.9"
    assert container["ports"][0]["containerPort"] == 9999
    assert pod["metadata"]["annotations"]["prometheus.io/port"] == "9999"
    assert container["resources"]["limits"]["memory"] == "2Gi"
    assert pod["spec"]["volumes"][1]["secret"]["secretName"] == "my-keys"
    assert not [k for k in objects if k[0] in ("Secret", "PodDisruptionBudget")]
    binding = objects[("ClusterRoleBinding", "", "kubegpu-scheduler")]
    assert binding["subjects"][0]["namespace"] == "gpu-sched"
    assert objects[("Lease", "gpu-sched", "sched-lease")]["kind"] == "Lease"
    assert "hostNetwork" not in pod["spec"]


def test_rbac_host_network_and_extra_env(helm: Helm) -> None:
    objects = by_key(
        render(
            helm,
            "rbac.create=false",
            "nodeAgent.rbac=false",
            "scheduler.hostNetwork=true",
            "scheduler.extraEnv[0].name=KUBERNETES_SERVICE_HOST",
            "scheduler.extraEnv[0].value=127.0.0.1",
            "scheduler.config.leaderElection.enabled=false",
            "scheduler.replicas=1",  # without leader election one replica only
            "namespace.podSecurity=privileged",  # a host-network pod is refused by the others
        )
    )
    kinds = {key[0] for key in objects}
    assert not kinds & {"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding", "Lease"}
    spec = objects[("Deployment", "kubegpu-system", "kubegpu-scheduler")]["spec"]["template"]["spec"]
    assert (spec["hostNetwork"], spec["dnsPolicy"]) == (True, "ClusterFirstWithHostNet")
    assert spec["serviceAccountName"] == "kubegpu-scheduler"
    env = {e["name"]: e for e in spec["containers"][0]["env"]}
    assert env["KUBERNETES_SERVICE_HOST"]["value"] == "127.0.0.1" and "POD_NAME" in env


def test_config_change_rolls_the_pods(helm: Helm) -> None:
    def checksum(*values: str) -> str:
        deployment = by_key(render(helm, *values))[("Deployment", "kubegpu-system", "kubegpu-scheduler")]
        return str(deployment["spec"]["template"]["metadata"]["annotations"]["checksum/config"])

    assert checksum() == checksum()
    assert checksum() != checksum("scheduler.config.policy=spread")


def test_ed25519_key_is_a_pkcs8_pem(helm: Helm) -> None:
    secret = by_key(render(helm, "signingKey.algorithm=ed25519"))[
        ("Secret", "kubegpu-system", "kubegpu-allocation-keys")
    ]
    pem = base64.b64decode(secret["data"]["k1"])
    assert pem.startswith(b"-----BEGIN PRIVATE KEY-----\n")
    body = base64.b64decode(b"".join(pem.strip().splitlines()[1:-1]))
    # PKCS#8 of an Ed25519 key: 48 bytes, algorithm OID 1.3.101.112 (06 03 2b 65 70)
    assert len(body) == 48 and b"\x06\x03\x2b\x65\x70" in body


@pytest.mark.parametrize(
    "value, message",
    [
        (
            "signingKey.algorithm=rsa",
            "at '/signingKey/algorithm': value must be 'ed25519'",
        ),
        ("namespace.name=", "at '/namespace/name': '' does not match pattern"),
        ("namespace.name=Not_A_Name", "at '/namespace/name': 'Not_A_Name' does not match pattern"),
        ("scheduler.metricsPort=0", "at '/scheduler/metricsPort': minimum: got 0, want 1"),
        ("scheduler.extender.port=0", "at '/scheduler/extender/port': minimum: got 0, want 1"),
        (
            "scheduler.config.signingKeyId=../k1",
            "at '/scheduler/config/signingKeyId': '../k1' does not match",
        ),
        ("image.pullPolicy=Sometimes", "at '/image/pullPolicy': value must be one of"),
        ("scheduler.replicas=two", "at '/scheduler/replicas': got string, want integer"),
    ],
)
def test_bad_values_fail_with_a_message(helm: Helm, value: str, message: str) -> None:
    """values.schema.json refuses them before anything renders, naming the value."""
    result = helm("template", "kubegpu", str(CHART), "--set", value, check=False)
    assert result.returncode != 0
    assert message in result.stderr, result.stderr


@pytest.mark.parametrize(
    "values, message",
    [
        (["scheduler.replcas=3"], "at '/scheduler': additional properties 'replcas' not allowed"),
        (["signingKey.existingsecret=mine"], "additional properties 'existingsecret' not allowed"),
        (["imag.tag=0.2.0"], "additional properties 'imag' not allowed"),
        (["signingKey.existingSecret=My_Keys"], "at '/signingKey/existingSecret': 'My_Keys' does not match"),
        (
            ["scheduler.podDisruptionBudget.maxUnavailable=half"],
            "'half' does not match pattern '^[0-9]+%$'",
        ),
        (
            ["scheduler.hostNetwork=true"],
            "scheduler.hostNetwork needs namespace.podSecurity=privileged (Pod Security 'restricted' "
            "refuses host-network pods)",
        ),
        (
            ["scheduler.hostNetwork=true", "namespace.podSecurity=baseline"],
            "Pod Security 'baseline' refuses host-network pods",
        ),
        (
            ["scheduler.config.leaderElection.enabled=false"],
            "2 scheduler replicas without scheduler.config.leaderElection.enabled would all bind",
        ),
    ],
    ids=[
        "typo",
        "typo-case",
        "typo-top",
        "secret-name",
        "pdb-not-a-number",
        "host-net",
        "host-net-baseline",
        "leaderless",
    ],
)
def test_nonsense_values_are_refused(helm: Helm, values: list[str], message: str) -> None:
    """Values that would install and then never work (a misspelt key silently ignored, pods Pod
    Security refuses, replicas that all bind) fail before anything renders, naming the value."""
    args = [arg for value in values for arg in ("--set", value)]
    result = helm("template", "kubegpu", str(CHART), *args, check=False)
    assert result.returncode != 0, values
    assert message in result.stderr, result.stderr


def test_sensible_neighbours_of_nonsense_render(helm: Helm) -> None:
    """What the checks above must still let through."""
    for values in (
        ["scheduler.hostNetwork=true", "namespace.podSecurity=privileged"],
        ["scheduler.hostNetwork=true", "namespace.create=false"],  # the namespace's label is yours
        ["scheduler.config.leaderElection.enabled=false", "scheduler.replicas=1"],
        ["scheduler.config.leaderElection.enabled=false", "scheduler.replicas=0"],
        ["scheduler.config.bindTimeoutSeconds=7", "signingKey.existingSecret=my-keys.v2"],
        ["scheduler.podDisruptionBudget.maxUnavailable=50%"],
        ["scheduler.resources.limits.nvidia\\.com/gpu=0", "scheduler.podAnnotations.a=b"],
    ):
        assert render(helm, *values), values


def test_extender_value_serves_kube_schedulers_calls(helm: Helm, tmp_path: Path) -> None:
    """scheduler.extender.enabled: the config's extenderAddress on the port, the container port and
    the Service kubegpu-extender as deploy/extender ships them; with tlsSecret, the Secret mounted
    where the config's extenderTls* files point. Off by default (test_defaults_render_deploy)."""
    from scheduler.live.config import validate

    shipped_config, shipped_service = load_documents(
        (DEPLOY / "extender" / "kubegpu-scheduler-config.yaml").read_text()
    )

    def scheduler_config(objects: dict[tuple[str, str, str], dict[str, Any]]) -> Any:
        path = tmp_path / "scheduler.yaml"
        path.write_text(
            objects[("ConfigMap", "kubegpu-system", "kubegpu-scheduler-config")]["data"]["scheduler.yaml"]
        )
        config = load_config(path)
        validate(config)
        return config

    objects = by_key(render(helm, "scheduler.extender.enabled=true"))
    config = scheduler_config(objects)
    assert config.extender_address == "0.0.0.0:8888" and config.extender_tls_cert_file is None
    service = objects[("Service", "kubegpu-system", "kubegpu-extender")]
    assert without_helm_bookkeeping(service) == without_helm_bookkeeping(shipped_service)
    shipped = yaml.safe_load(shipped_config["data"]["scheduler.yaml"])
    assert {k: v for k, v in vars(config).items() if k.startswith("extender")} == {
        "extender_address": shipped["extenderAddress"],
        "extender_tls_cert_file": None,
        "extender_tls_private_key_file": None,
        "extender_advertise_address": None,  # $POD_IP, which the Deployment sets
    }
    pod = objects[("Deployment", "kubegpu-system", "kubegpu-scheduler")]["spec"]["template"]
    assert service["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
    env = {e["name"]: e.get("valueFrom") for e in pod["spec"]["containers"][0]["env"]}
    assert env["POD_IP"] == {"fieldRef": {"fieldPath": "status.podIP"}}  # a standby relays there
    ports = {p["name"]: p["containerPort"] for p in pod["spec"]["containers"][0]["ports"]}
    assert ports["extender"] == 8888
    assert not any(v["name"] == "extender-tls" for v in pod["spec"]["volumes"])

    objects = by_key(
        render(
            helm,
            "scheduler.extender.enabled=true",
            "scheduler.extender.port=9443",
            "scheduler.extender.tlsSecret=ext-tls",
        )
    )
    config = scheduler_config(objects)
    assert config.extender_address == "0.0.0.0:9443"
    pod = objects[("Deployment", "kubegpu-system", "kubegpu-scheduler")]["spec"]["template"]
    volume = next(v for v in pod["spec"]["volumes"] if v["name"] == "extender-tls")
    mount = next(m for m in pod["spec"]["containers"][0]["volumeMounts"] if m["name"] == "extender-tls")
    assert volume["secret"]["secretName"] == "ext-tls" and mount["readOnly"]
    assert (config.extender_tls_cert_file, config.extender_tls_private_key_file) == (
        f"{mount['mountPath']}/tls.crt",
        f"{mount['mountPath']}/tls.key",
    )
    service = objects[("Service", "kubegpu-system", "kubegpu-extender")]
    assert service["spec"]["ports"][0]["port"] == service["spec"]["ports"][0]["targetPort"] == 9443
    assert {p["name"]: p["containerPort"] for p in pod["spec"]["containers"][0]["ports"]}["extender"] == 9443


def test_service_monitor(helm: Helm) -> None:
    objects = by_key(
        render(helm, "metrics.serviceMonitor.enabled=true", "metrics.serviceMonitor.labels.team=ml")
    )
    monitor = objects[("ServiceMonitor", "kubegpu-system", "kubegpu-scheduler")]
    service = objects[("Service", "kubegpu-system", "kubegpu-scheduler-metrics")]
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["metadata"]["labels"]["team"] == "ml"
    assert monitor["spec"]["endpoints"][0]["port"] == service["spec"]["ports"][0]["name"] == "metrics"
    selected = monitor["spec"]["selector"]["matchLabels"]
    assert selected.items() <= service["metadata"]["labels"].items()
    pod_labels = objects[("Deployment", "kubegpu-system", "kubegpu-scheduler")]["spec"]["template"][
        "metadata"
    ]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()


# ------------------------------------------------------------------ against the real apiserver

SERVICE_MONITOR_CRD = """
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: servicemonitors.monitoring.coreos.com
spec:
  group: monitoring.coreos.com
  names:
    {kind: ServiceMonitor, listKind: ServiceMonitorList, plural: servicemonitors, singular: servicemonitor}
  scope: Namespaced
  versions:
    - name: v1
      served: true
      storage: true
      schema:
        openAPIV3Schema:
          type: object
          x-kubernetes-preserve-unknown-fields: true
"""


@pytest.mark.apiserver
@pytest.mark.parametrize(
    "values",
    [
        [],
        ["scheduler.config.signingKeyId=k9"],
        ["signingKey.existingSecret=mine", "nodeAgent.rbac=false"],
        ["metrics.serviceMonitor.enabled=true"],
        ["scheduler.extender.enabled=true", "scheduler.extender.tlsSecret=extender-tls"],
    ],
    ids=["defaults", "other-key-id", "existing-secret", "service-monitor", "extender"],
)
def test_server_side_dry_run(helm: Helm, admin_api: k8s.ApiClient, tmp_path: Path, values: list[str]) -> None:
    """Every rendered object passes the real apiserver's validation and admission (dry run), in
    a namespace of its own that the chart creates with the `restricted` Pod Security label."""
    namespace = f"h-{uuid.uuid4().hex[:8]}"
    objects = render(helm, f"namespace.name={namespace}", *values)
    if "metrics.serviceMonitor.enabled=true" in values:
        crd = tmp_path / "crd.yaml"
        crd.write_text(SERVICE_MONITOR_CRD)
        apply_manifests(admin_api, [crd])
        wait_served(admin_api, "monitoring.coreos.com/v1", "ServiceMonitor")
    assert objects[0]["kind"] == "Namespace"  # Helm orders it first
    # The namespace and the ServiceAccounts for real (the pod's admission looks its account up).
    real = [o for o in objects if o["kind"] in ("Namespace", "ServiceAccount")]
    rest = [o for o in objects if o not in real]
    for name, docs, dry in (("real.yaml", real, False), ("rest.yaml", rest, True)):
        path = tmp_path / name
        path.write_text(yaml.safe_dump_all(docs))
        applied = apply_manifests(admin_api, [path], dry_run=dry)
        assert len(applied) == len(docs)
    pod = next(o for o in rest if o["kind"] == "Deployment")["spec"]["template"]
    dry_pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "probe", "namespace": namespace, "labels": pod["metadata"]["labels"]},
        "spec": pod["spec"],
    }
    path = tmp_path / "pod.yaml"
    path.write_text(yaml.safe_dump(dry_pod))
    apply_manifests(admin_api, [path], dry_run=True)  # passes Pod Security "restricted"
    k8s.CoreV1Api(admin_api).delete_namespace(namespace)


def wait_served(api: k8s.ApiClient, api_version: str, kind: str) -> None:
    """Wait until discovery lists ``kind`` (a CRD is served a moment after it is created)."""

    def served() -> bool:
        try:
            Discovery(api).resource(api_version, kind)
        except ManifestError:
            return False
        return True

    wait_for(served, timeout=30)


@pytest.fixture(scope="module")
def private_plane(
    tmp_path_factory: pytest.TempPathFactory, control_plane: ControlPlane
) -> Iterator[ControlPlane]:
    """A control plane of this module's own: the chart's cluster-wide objects (ClusterRoles
    kubegpu-scheduler, kubegpu-node) would collide with deploy/'s in the session one."""
    plane = ControlPlane(run_dir=tmp_path_factory.mktemp("helm-plane"), binaries=control_plane.binaries)
    plane.start()
    yield plane
    plane.stop()


def ours(api: k8s.ApiClient, namespace: str) -> list[str]:
    """kubegpu's objects left in the cluster, and the namespace if it is not Terminating."""
    found = labelled(api)
    try:
        if k8s.CoreV1Api(api).read_namespace(namespace).status.phase != "Terminating":
            found.append(f"namespace {namespace}")
    except k8s.ApiException as exc:
        assert exc.status == 404
    return found


def secret_data(api: k8s.ApiClient, namespace: str) -> dict[str, bytes]:
    secret = k8s.CoreV1Api(api).read_namespaced_secret("kubegpu-allocation-keys", namespace)
    return {key: base64.b64decode(value) for key, value in (secret.data or {}).items()}


@pytest.mark.apiserver
def test_install_upgrade_keeps_the_key_uninstall_removes_all(helm: Helm, private_plane: ControlPlane) -> None:
    kubeconfig = private_plane.admin_kubeconfig
    api = private_plane.admin_client()
    namespace = "kubegpu-system"
    ensure_namespace(k8s.CoreV1Api(api), "releases")
    try:
        helm("install", "kubegpu", str(CHART), "--namespace", "releases", kubeconfig=kubeconfig)
        installed = secret_data(api, namespace)
        assert set(installed) == {"k1"} and isinstance(parse_key(installed["k1"]), SigningKey)
        labels = k8s.CoreV1Api(api).read_namespace(namespace).metadata.labels
        assert labels["pod-security.kubernetes.io/enforce"] == "restricted"

        helm(
            "upgrade",
            "kubegpu",
            str(CHART),
            "--namespace",
            "releases",
            "--set",
            "scheduler.replicas=1",
            kubeconfig=kubeconfig,
        )
        assert secret_data(api, namespace) == installed  # kept, not regenerated
        deployment = k8s.AppsV1Api(api).read_namespaced_deployment("kubegpu-scheduler", namespace)
        assert deployment.spec.replicas == 1

        # rotation: a new signing key id is added beside the old key (a dot in it: NOTES' jsonpath
        # must escape it, or kubectl reads .data.k2 and prints nothing)
        helm(
            "upgrade",
            "kubegpu",
            str(CHART),
            "--namespace",
            "releases",
            "--reuse-values",
            "--set",
            "scheduler.config.signingKeyId=k2.v2",
            kubeconfig=kubeconfig,
        )
        rotated = secret_data(api, namespace)
        assert (
            rotated["k1"] == installed["k1"]
            and isinstance(parse_key(rotated["k2.v2"]), SigningKey)
            and rotated["k2.v2"] != rotated["k1"]
        )
        config = k8s.CoreV1Api(api).read_namespaced_config_map("kubegpu-scheduler-config", namespace)
        assert yaml.safe_load(config.data["scheduler.yaml"])["signingKeyId"] == "k2.v2"

        status = helm("status", "kubegpu", "--namespace", "releases", kubeconfig=kubeconfig).stdout
        assert "STATUS: deployed" in status and "REVISION: 3" in status
        notes = helm("get", "notes", "kubegpu", "--namespace", "releases", kubeconfig=kubeconfig).stdout
        assert "kubegpu node install --key-id k2.v2 --key-file -" in notes
        assert "get secret kubegpu-allocation-keys -o jsonpath='{.data.k2\\.v2}' | base64 -d" in notes
    finally:
        helm("uninstall", "kubegpu", "--namespace", "releases", kubeconfig=kubeconfig, check=False)
    assert ours(api, namespace) == []
    api.close()


@pytest.mark.apiserver
def test_install_keeps_an_existing_nrt_crd(helm: Helm, private_plane: ControlPlane) -> None:
    """The chart ships upstream's NodeResourceTopology CRD in crds/: where a cluster already has a
    copy (NFD's, scheduler-plugins'), install leaves it as it is and uninstall does not delete it;
    the chart's other CRDs are installed beside it."""
    kubeconfig = private_plane.admin_kubeconfig
    api = private_plane.admin_client()
    extensions = k8s.ApiextensionsV1Api(api)
    name = "noderesourcetopologies.topology.node.k8s.io"
    theirs = yaml.safe_load((CHART / "crds" / "topology.node.k8s.io_noderesourcetopologies.yaml").read_text())
    theirs["metadata"]["labels"] = {"app.kubernetes.io/managed-by": "nfd"}
    theirs["spec"]["versions"] = [v for v in theirs["spec"]["versions"] if v["name"] == "v1alpha2"]

    def absent() -> bool:
        try:
            extensions.read_custom_resource_definition(name)
        except k8s.ApiException as error:
            return error.status == 404
        return False

    if not absent():  # an earlier install's copy: Helm never deletes the CRDs it installed
        extensions.delete_custom_resource_definition(name)
        wait_for(absent, timeout=60)
    extensions.create_custom_resource_definition(theirs)

    def untouched() -> None:
        kept = extensions.read_custom_resource_definition(name)
        assert kept.metadata.generation == 1
        assert kept.metadata.labels == {"app.kubernetes.io/managed-by": "nfd"}
        assert [v.name for v in kept.spec.versions] == ["v1alpha2"]  # not replaced by the chart's copy
        assert {f.manager for f in kept.metadata.managed_fields} <= {"kube-apiserver", "OpenAPI-Generator"}

    ensure_namespace(k8s.CoreV1Api(api), "releases")
    try:
        helm(
            "install",
            "nrt-kept",
            str(CHART),
            "--namespace",
            "releases",
            "--set",
            "namespace.name=nrt-kept",  # another install's namespace may still be terminating
            kubeconfig=kubeconfig,
        )
        untouched()
        extensions.read_custom_resource_definition("nodegpumetrics.kubegpu.io")  # installed beside it
    finally:
        helm("uninstall", "nrt-kept", "--namespace", "releases", kubeconfig=kubeconfig, check=False)
    untouched()
    extensions.delete_custom_resource_definition(name)
    api.close()
