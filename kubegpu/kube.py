"""Kubernetes API client construction shared by the node agent and the scheduler, and breaking off
a watch's response from another thread (``shut_response``).

A kubeconfig that cannot be used raises ``cliargs.UsageError`` naming the flag, the file and the
problem; ``check_reachable`` raises ``cliargs.Failure`` when the API server cannot be reached or
refuses the credentials (docs/errors.md).
"""

from __future__ import annotations

import copy
import errno
import json
import os
import re
import ssl
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import urllib3
import yaml
from kubernetes import client, config
from kubernetes.client.rest import RESTClientObject, RESTResponse
from kubernetes.config.config_exception import ConfigException

from kubegpu import leanpost
from kubegpu.cliargs import Failure, UsageError, api_status_message, one_line
from kubegpu.inputfiles import check_input, read_text

PROBE_TIMEOUT_SECONDS = 10.0


def api_client(
    kubeconfig: str | Path | None, flag: str = "--kubeconfig", pool: int | None = None
) -> client.ApiClient | None:
    """A client from ``kubeconfig``, else the in-cluster service account, else None.

    ``pool``: keep up to that many connections to the apiserver (at least the client's default,
    5 per CPU) for callers with that many requests in flight at once; beyond the pool each request
    opens a new TLS connection and drops it after."""
    configuration = client.Configuration()
    if pool is not None:
        configuration.connection_pool_maxsize = max(pool, configuration.connection_pool_maxsize)
    if kubeconfig:
        return _from_kubeconfig(str(kubeconfig), flag, configuration)
    if os.environ.get("KUBERNETES_SERVICE_HOST"):
        try:
            config.load_incluster_config(client_configuration=configuration)
        except ConfigException as error:
            raise UsageError(f"in-cluster service account: {error}") from None
        return client.ApiClient(configuration)
    return None


def _from_kubeconfig(path: str, flag: str, configuration: client.Configuration) -> client.ApiClient:
    where = f"{flag} {path}"
    try:
        check_input(path)
    except OSError as error:
        raise UsageError(f"{where}: {error.strerror or error}") from None
    _check_referenced_files(path, where)
    try:
        api = config.new_client_from_config(config_file=path, client_configuration=configuration)
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        at = f" (line {mark.line + 1})" if mark is not None else ""
        raise UsageError(f"{where}: not YAML: {getattr(error, 'problem', None) or error}{at}") from None
    except ConfigException as error:
        raise UsageError(f"{where}: {error}") from None
    except (OSError, ValueError, TypeError, AttributeError, KeyError) as error:
        # The client trusts the file's shape: a list, a string or a missing section lands here.
        raise UsageError(f"{where}: not a kubeconfig ({type(error).__name__}: {error})") from None
    server = api.configuration.host or ""
    parts = urlsplit(server)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        api.close()
        raise UsageError(f"{where}: the cluster's server {server!r} is not an http(s):// URL")
    return api


_FILE_FIELDS = {
    "cluster": ("certificate-authority",),
    "user": ("client-certificate", "client-key", "tokenFile"),
}


def _check_referenced_files(path: str, where: str) -> None:
    """The files the current context names (CA, client certificate and key, token file) must be
    regular files of a bounded size: the client would block on a FIFO or read ``/dev/zero`` forever.
    A missing file, or a shape the client refuses anyway, is left to the client's own message."""
    try:
        doc = yaml.safe_load(read_text(path))
        context = _named(doc.get("contexts"), doc.get("current-context"))["context"]
    except (OSError, ValueError, yaml.YAMLError, AttributeError, KeyError, TypeError, RecursionError):
        return
    for section, fields in _FILE_FIELDS.items():
        entry = _named(doc.get(f"{section}s"), context.get(section) if isinstance(context, dict) else None)
        body = entry.get(section) if isinstance(entry, dict) else None
        for field in fields:
            name = body.get(field) if isinstance(body, dict) else None
            if not isinstance(name, str) or not name:
                continue
            target = Path(path).parent / name  # relative paths are relative to the kubeconfig
            try:
                check_input(target)
            except OSError as error:
                if error.errno == errno.ENOENT:
                    continue  # the client says which file is missing
                shown = name if name.isprintable() else repr(name)
                raise UsageError(f"{where}: {field} {shown}: {error.strerror or error}") from None
            except ValueError:  # a NUL in the name
                raise UsageError(f"{where}: {field} {name!r}: not a file name") from None


def _named(items: object, name: object) -> dict:
    """The entry called ``name`` of a kubeconfig list ({} if there is none)."""
    for item in items if isinstance(items, list) else []:
        if isinstance(item, dict) and item.get("name") == name:
            return item
    return {}


def _cause(error: BaseException) -> str:
    """The root cause of a urllib3 error on one line, without urllib3's object names."""
    reason = getattr(error, "reason", None) or error
    text = str(reason)
    text = re.sub(r"^\w+\((host=)?'[^']*', port=\d+\):\s*", "", text)  # HTTPSConnection(host=..., port=..):
    text = re.sub(r"<[^<>]* object at 0x[0-9a-f]+>:?\s*", "", text)
    return one_line(text or type(reason).__name__, 300)


def check_reachable(api: client.ApiClient, timeout: float = PROBE_TIMEOUT_SECONDS) -> None:
    """Ask the API server its version with ``api``'s credentials; raise ``Failure`` saying why not.

    This checks the network path, TLS and authentication (a bad token gets 401), not authorization.
    """
    server = api.configuration.host
    settings = copy.deepcopy(api.configuration)
    settings.retries = False  # one try: urllib3's retries would each log a warning line
    try:
        with client.ApiClient(settings) as probe:
            client.VersionApi(probe).get_code(_request_timeout=timeout)
    except client.ApiException as error:
        if not error.status:  # the client's wrapping of a TLS failure: no answer came
            reason = one_line(str(error.reason), 300)
            raise Failure(f"cannot reach the API server at {server}: {reason}") from None
        raise Failure(f"the API server at {server} answered {api_status_message(error)}") from None
    except (urllib3.exceptions.HTTPError, OSError) as error:
        raise Failure(f"cannot reach the API server at {server}: {_cause(error)}") from None


def check_access(what: str, call: Callable[[], object]) -> None:
    """Run one read the command needs (``what`` says which); raise ``Failure`` if it is refused."""
    try:
        call()
    except client.ApiException as error:
        if not error.status:
            raise Failure(f"cannot {what}: {one_line(str(error.reason), 300)}") from None
        raise Failure(f"the API server refused to {what}: {api_status_message(error)}") from None
    except (urllib3.exceptions.HTTPError, OSError) as error:
        raise Failure(f"cannot {what}: {_cause(error)}") from None


def shut_response(response: Any) -> None:
    """Break off an HTTP response another thread may be reading (a watch in flight): shutting the
    socket down (urllib3 2.3+) wakes a blocked read, which then fails; closing it keeps the
    connection out of the pool."""
    for close in (getattr(response, "shutdown", None), getattr(response, "close", None)):
        if close is not None:
            try:
                close()
            except Exception:  # noqa: BLE001 - already closed; nothing more to do
                pass


BINDING_PATH = "/api/v1/namespaces/{namespace}/pods/{name}/binding"
BINDING_ACCEPT = [  # as CoreV1Api.create_namespaced_pod_binding lists them
    "application/json",
    "application/yaml",
    "application/vnd.kubernetes.protobuf",
    "application/cbor",
]


class BindingCoreV1Api(client.CoreV1Api):
    """``CoreV1Api`` whose ``create_namespaced_pod_binding`` for a Binding given as a plain dict,
    unparsed (``_preload_content=False``), skips the generated method's per-call argument
    validation and body sanitising, about a tenth of a Binding's CPU in the extender
    (docs/performance.md). Any other call goes to the generated method."""

    def create_namespaced_pod_binding(self, name: Any, namespace: Any, body: Any, **kwargs: Any) -> Any:
        if (
            kwargs.keys() <= {"_preload_content", "_request_timeout"}
            and kwargs.get("_preload_content") is False
            and isinstance(body, dict)
            and isinstance(name, str)
            and isinstance(namespace, str)
        ):
            return post_pod_binding(self.api_client, name, namespace, body, kwargs.get("_request_timeout"))
        return super().create_namespaced_pod_binding(name, namespace, body, **kwargs)


def post_pod_binding(
    api: client.ApiClient, name: str, namespace: str, binding: dict[str, Any], timeout: Any
) -> Any:
    """POST a Binding (a plain JSON-able dict) as ``CoreV1Api.create_namespaced_pod_binding(...,
    _preload_content=False, _request_timeout=timeout)`` does and return its unread urllib3
    response (the caller reads and releases it).

    The same URL, headers (Accept, the client's defaults, the configured auth, refreshed per call
    as the client refreshes it), JSON body, timeout and connection pool; the same errors: a non-2xx
    answer raises ``ApiException`` with its status, reason and body, a connection failure or
    timeout whatever the client's REST layer raises. The request goes to the URL's urllib3 pool
    itself (``post_json``)."""
    accept = api.select_header_accept(BINDING_ACCEPT)
    method, url, headers, _, _ = api.param_serialize(
        method="POST",
        resource_path=BINDING_PATH,
        path_params={"name": name, "namespace": namespace},
        header_params={"Accept": accept} if accept else {},
        auth_settings=["BearerToken"],
    )
    response = post_json(api.rest_client, url, headers, binding, timeout)
    if not 200 <= response.status <= 299:
        answer = RESTResponse(response)
        answer.read()
        raise client.ApiException.from_response(http_resp=answer, body=None, data=None)
    return response


def post_json(rest: RESTClientObject, url: str, headers: dict[str, str], body: Any, timeout: Any) -> Any:
    """``rest.request("POST", url, headers=headers, body=body, _request_timeout=timeout)`` for a
    JSON body, returning a response to read and release: written and read by
    ``kubegpu.leanpost`` on a connection of the URL's own pool in the client's ``PoolManager``
    (the same connections, TLS settings and socket options), without urllib3's and http.client's
    request and answer machinery (docs/performance.md). A redirect is answered as it comes (an
    error to the caller; the API server does not redirect a Binding). A client that goes through
    a proxy, or a body with a Content-Type, takes the REST layer's path. A TLS failure raises
    ``ApiException`` with status 0, as the REST layer does."""
    manager = rest.pool_manager
    if type(manager) is not urllib3.PoolManager or "Content-Type" in headers:
        return rest.request("POST", url, headers=headers, body=body, _request_timeout=timeout).response
    parts = urlsplit(url)
    target = f"{parts.path}?{parts.query}" if parts.query else parts.path
    host = parts.hostname or ""
    if ":" in host:  # IPv6: bracketed, as urllib3's parse_url gives it (the REST layer's pool key)
        host = f"[{host}]"
    pool = manager.connection_from_host(host, parts.port, parts.scheme)
    try:
        return leanpost.post(pool, target or "/", headers, json.dumps(body).encode(), timeout)
    except (ssl.SSLError, urllib3.exceptions.SSLError) as error:  # as the REST layer reports it
        raise client.ApiException(status=0, reason=f"{type(error).__name__}\n{error}") from error
