"""Apply Kubernetes manifests (YAML files) with a python ApiClient, like ``kubectl apply --server-side``.

Used by the tests (and demos) to install ``deploy/`` into the test control plane. Every object
goes out as one server-side apply request (``PATCH`` with ``application/apply-patch+yaml``,
``force=true``), which creates a missing object and updates an existing one, so applying twice
is harmless. The resource path comes from the apiserver's discovery, so any kind it serves
works, without the generated client's per-kind methods (and their model round trip).

Typical use::

    applied = apply_manifests(admin_api, [Path("deploy")])   # a directory: its *.yaml, sorted
    applied = apply_manifests(admin_api, [path], dry_run=True)  # validate only
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client as k8s

APPLY_PATCH = "application/apply-patch+yaml"
FIELD_MANAGER = "kubegpu-devenv"
MANIFEST_SUFFIXES = (".yaml", ".yml", ".json")  # what `kubectl apply -f DIR` reads


class ManifestError(ValueError):
    """A manifest is malformed, or names a kind the apiserver does not serve."""


@dataclass(frozen=True)
class ResourceInfo:
    """Where a kind lives in the API."""

    plural: str
    namespaced: bool


@dataclass(frozen=True)
class Applied:
    """One object as the apiserver stored it."""

    kind: str
    namespace: str | None
    name: str
    body: dict[str, Any]


# --------------------------------------------------------------------------- reading


def manifest_files(paths: Iterable[Path | str]) -> list[Path]:
    """Files to apply: each file as given, each directory's manifest files in name order.

    As with ``kubectl apply -f DIR``, only names ending in .yaml, .yml or .json are read from a
    directory, so a template such as ``*.yaml.template`` is left out.
    """
    files: list[Path] = []
    for path in map(Path, paths):
        if path.is_dir():
            files.extend(sorted(p for p in path.iterdir() if p.is_file() and p.suffix in MANIFEST_SUFFIXES))
        else:
            files.append(path)
    return files


def load_documents(text: str, source: str = "<text>") -> list[dict[str, Any]]:
    """The objects in a (multi-document) YAML text; empty documents are skipped, Lists expanded."""
    objects: list[dict[str, Any]] = []
    for index, doc in enumerate(yaml.safe_load_all(text)):
        if doc is None:
            continue
        if not isinstance(doc, dict):
            raise ManifestError(f"{source}: document {index} is not a mapping")
        items = doc.get("items", []) if doc.get("kind", "").endswith("List") else [doc]
        for item in items:
            check_object(item, f"{source}: document {index}")
            objects.append(item)
    return objects


def check_object(obj: Mapping[str, Any], where: str) -> None:
    """Refuse an object without apiVersion, kind or metadata.name."""
    for key in ("apiVersion", "kind"):
        if not isinstance(obj.get(key), str) or not obj[key]:
            raise ManifestError(f"{where}: missing {key}")
    metadata = obj.get("metadata")
    if not isinstance(metadata, dict) or not metadata.get("name"):
        raise ManifestError(f"{where}: missing metadata.name")


def group_version_path(api_version: str) -> str:
    """``v1`` -> ``/api/v1``; ``apps/v1`` -> ``/apis/apps/v1``."""
    return f"/api/{api_version}" if "/" not in api_version else f"/apis/{api_version}"


def object_path(obj: Mapping[str, Any], info: ResourceInfo, default_namespace: str) -> tuple[str, str | None]:
    """The object's URL path and its namespace (None for a cluster-scoped kind)."""
    name = obj["metadata"]["name"]
    base = group_version_path(obj["apiVersion"])
    if not info.namespaced:
        return f"{base}/{info.plural}/{name}", None
    namespace = obj["metadata"].get("namespace") or default_namespace
    return f"{base}/namespaces/{namespace}/{info.plural}/{name}", namespace


# --------------------------------------------------------------------------- requests


def request(
    api: k8s.ApiClient,
    method: str,
    path: str,
    query: list[tuple[str, str]] | None = None,
    body: Any = None,
    content_type: str = "application/json",
    timeout: float = 30,
) -> dict[str, Any]:
    """One raw API request; the decoded JSON answer. A non-2xx answer raises ``ApiException``."""
    headers = {"Accept": "application/json", "Content-Type": content_type}
    method, url, headers, body, post = api.param_serialize(
        method,
        path,
        query_params=query or [],
        header_params=headers,
        body=body,
        auth_settings=["BearerToken"],
    )
    response = api.call_api(method, url, headers, body, post, _request_timeout=timeout)
    response.read()
    text = response.data.decode("utf-8") if response.data else ""
    if not 200 <= response.status <= 299:
        raise k8s.ApiException.from_response(http_resp=response, body=text, data=None)
    return json.loads(text) if text else {}


class Discovery:
    """Kind -> plural and scope, from ``/api/v1`` and ``/apis/<group>/<version>`` (cached)."""

    def __init__(self, api: k8s.ApiClient) -> None:
        self.api = api
        self._cache: dict[str, dict[str, ResourceInfo]] = {}

    def resource(self, api_version: str, kind: str) -> ResourceInfo:
        if api_version not in self._cache:
            try:
                listing = request(self.api, "GET", group_version_path(api_version))
            except k8s.ApiException as exc:
                if exc.status == 404:
                    raise ManifestError(f"the apiserver does not serve {api_version}") from None
                raise
            self._cache[api_version] = resources_by_kind(listing)
        info = self._cache[api_version].get(kind)
        if info is None:
            raise ManifestError(f"the apiserver serves no kind {kind} in {api_version}")
        return info


def resources_by_kind(listing: Mapping[str, Any]) -> dict[str, ResourceInfo]:
    """An APIResourceList's top-level resources (no subresources), by kind."""
    return {
        item["kind"]: ResourceInfo(item["name"], bool(item.get("namespaced")))
        for item in listing.get("resources", [])
        if "/" not in item["name"]
    }


def apply_object(
    api: k8s.ApiClient,
    obj: Mapping[str, Any],
    discovery: Discovery | None = None,
    default_namespace: str = "default",
    field_manager: str = FIELD_MANAGER,
    dry_run: bool = False,
) -> Applied:
    """Server-side apply one object (create or update); what the apiserver stored."""
    check_object(obj, f"{obj.get('kind')} {obj.get('metadata', {}).get('name')}")
    info = (discovery or Discovery(api)).resource(obj["apiVersion"], obj["kind"])
    path, namespace = object_path(obj, info, default_namespace)
    body = dict(obj)
    if namespace is not None:
        body["metadata"] = {**obj["metadata"], "namespace": namespace}
    query = [("fieldManager", field_manager), ("force", "true")]
    if dry_run:
        query.append(("dryRun", "All"))
    stored = request(api, "PATCH", path, query, body, APPLY_PATCH)
    return Applied(obj["kind"], namespace, obj["metadata"]["name"], stored)


def iter_objects(paths: Iterable[Path | str]) -> Iterator[dict[str, Any]]:
    """Every object in the manifest files of ``paths`` (see :func:`manifest_files`), in order."""
    for path in manifest_files(paths):
        yield from load_documents(path.read_text(), str(path))


def apply_manifests(
    api_client: k8s.ApiClient,
    paths: Iterable[Path | str],
    default_namespace: str = "default",
    field_manager: str = FIELD_MANAGER,
    dry_run: bool = False,
) -> list[Applied]:
    """Apply every object of the files (directories: their *.yaml/*.yml/*.json) in order.

    Objects are applied in file order, documents in their order in the file: put a Namespace
    before what lives in it (``deploy/`` numbers its files for that). The first refusal raises
    ``ApiException`` (``ManifestError`` for a malformed file or an unknown kind).
    """
    discovery = Discovery(api_client)
    return [
        apply_object(api_client, obj, discovery, default_namespace, field_manager, dry_run)
        for obj in iter_objects(paths)
    ]
