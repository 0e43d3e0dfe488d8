"""A standby extender replica relays kube-scheduler's calls to the leader (docs/extender.md).

With leader election only the leader answers the extender's verbs, but the Service in front of
the replicas sends each call to any of them. So the leader writes where its extender listens into
the Lease it holds: the annotation ``kubegpu.io/extender-leader`` (``{"holder": IDENTITY, "url":
URL}``), written in the same conditional update that takes or renews the Lease and dropped when it
gives the Lease up (``LeaderElector(annotations=...)``). A standby reads the Lease at each
election attempt; a verb request it receives goes, unchanged, to that URL when the Lease is held
by another replica whose lease has not run out and the annotation names that holder
(:func:`leader_url`, pure). The answer, whatever it is, goes back to kube-scheduler as it came.

- One hop only: a relayed request carries ``Kubegpu-Relayed-By: <identity>``; a replica that
  gets one and cannot answer itself says 503, it never relays again (no loops while the Lease
  changes hands).
- Bounded: the relay gives up after ``RELAY_TIMEOUT_SECONDS`` in all (below kube-scheduler's
  ``httpTimeout: 5s``) and answers 503 with why; kube-scheduler retries the pod.
- TLS: a replica serving HTTPS relays over HTTPS and accepts only a leader whose certificate
  chains to a certificate in its own certificate file (the replicas mount one Secret); the
  leader is reached by its pod IP, which the certificate need not name, so the host name is not
  checked.

Where a replica is reached (:func:`advertised_url`): ``extenderAdvertiseAddress`` (``kubegpu
extender --advertise-address``), else ``$POD_IP`` (the downward API) with the listening port, else
the listening address when it names one host. Without any, the leader writes no annotation and
standbys answer 503 as before.
"""

from __future__ import annotations

import http.client
import json
import logging
import ssl
import time
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any
from urllib.parse import urlsplit

from prometheus_client import CollectorRegistry, Counter

from kubegpu.cliargs import WILDCARD_HOSTS, split_host_port
from kubegpu.logs import log_event
from scheduler.live.leader import Decision, LeaseRecord, decide, utc_now

log = logging.getLogger("kubegpu.extender")
ANNOTATION = "kubegpu.io/extender-leader"
RELAYED_HEADER = "Kubegpu-Relayed-By"
RELAY_TIMEOUT_SECONDS = 4.0
MAX_ANSWER_BYTES = 64 << 20


def verb_of(path: str) -> str:
    """The extender verb a request path names: its last segment, without the query."""
    return path.split("?", 1)[0].strip("/").rsplit("/", 1)[-1]


def advertised_url(advertise: str | None, listen: str, tls: bool, env: Mapping[str, str]) -> str | None:
    """The URL other replicas reach this replica's extender at, or None when it is not known."""
    scheme = "https" if tls else "http"
    _, port = split_host_port(listen)
    if advertise:
        host, port = split_host_port(advertise)
    elif env.get("POD_IP"):
        host = env["POD_IP"]
    else:
        host, _ = split_host_port(listen)
        if host in WILDCARD_HOSTS or port == 0:
            return None
    if ":" in host:
        host = f"[{host}]"
    return f"{scheme}://{host}:{port}"


def leader_annotation(identity: str, url: str) -> dict[str, str]:
    """The Lease annotation a leader writes: its identity and its extender's URL."""
    return {ANNOTATION: json.dumps({"holder": identity, "url": url}, separators=(",", ":"))}


def leader_url(
    record: LeaseRecord | None, annotations: Mapping[str, str], identity: str, now: datetime
) -> str | None:
    """Where a standby relays to: the holder's URL while another replica holds a fresh Lease and
    the annotation is the holder's own; None otherwise (us, no holder, expired, stale or bad)."""
    if record is None or not identity or decide(record, identity, now) is not Decision.HELD:
        return None
    try:
        doc = json.loads(annotations.get(ANNOTATION) or "")
    except ValueError:
        return None
    if not isinstance(doc, dict) or doc.get("holder") != record.holder:
        return None
    url = doc.get("url")
    if not isinstance(url, str):
        return None
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return None
    try:
        parts.port  # noqa: B018 -- raises on a bad port
    except ValueError:
        return None
    return url


class Relay:
    """Relays a standby's verb requests to the leader its elector last saw."""

    def __init__(
        self,
        elector: Callable[[], Any],
        identity: str,
        registry: CollectorRegistry,
        tls_cert_file: str | None = None,
        clock: Callable[[], datetime] = utc_now,
    ) -> None:
        self._elector = elector
        self.identity = identity
        self._clock = clock
        self._context: ssl.SSLContext | None = None
        if tls_cert_file:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
            context.minimum_version = ssl.TLSVersion.TLSv1_2
            context.check_hostname = False  # a pod IP; trust is the pinned certificate
            context.verify_mode = ssl.CERT_REQUIRED
            context.verify_flags |= ssl.VERIFY_X509_PARTIAL_CHAIN
            context.load_verify_locations(cafile=tls_cert_file)
            self._context = context
        self.relayed = Counter(
            "kubegpu_extender_relayed_total",
            "Extender requests a standby relayed to the leader, by verb and the HTTP status returned",
            ["verb", "code"],
            registry=registry,
        )

    def target(self) -> str | None:
        """The leader's URL, when another replica leads and said where it listens."""
        elector = self._elector()
        if elector is None:
            return None
        return leader_url(elector.observed, elector.observed_annotations, self.identity, self._clock())

    def relay(self, url: str, path: str, body: bytes) -> tuple[int, str, bytes]:
        """POST ``body`` to ``url`` + ``path``: (status, content type, body) as answered, or 503 with
        why when the leader could not be reached within ``RELAY_TIMEOUT_SECONDS``."""
        verb = verb_of(path)[:50]
        deadline = time.monotonic() + RELAY_TIMEOUT_SECONDS
        parts = urlsplit(url)
        target = parts.path.rstrip("/") + path
        connection: http.client.HTTPConnection
        if parts.scheme == "https":
            connection = http.client.HTTPSConnection(
                parts.hostname or "", parts.port or 443, timeout=RELAY_TIMEOUT_SECONDS, context=self._context
            )
        else:
            connection = http.client.HTTPConnection(
                parts.hostname or "", parts.port or 80, timeout=RELAY_TIMEOUT_SECONDS
            )
        try:
            connection.connect()
            headers = {"Content-Type": "application/json", RELAYED_HEADER: self.identity}
            _left(connection, deadline)
            connection.request("POST", target, body=body, headers=headers)
            _left(connection, deadline)
            response = connection.getresponse()
            _left(connection, deadline)
            answer = response.read(MAX_ANSWER_BYTES + 1)
            if len(answer) > MAX_ANSWER_BYTES:
                raise http.client.HTTPException(f"answer over {MAX_ANSWER_BYTES} bytes")
            status, kind = response.status, response.getheader("Content-Type") or "application/json"
        except (OSError, http.client.HTTPException, ValueError) as error:
            reason = f"{type(error).__name__}: {error}"[:200]
            log_event(log, "extender.relay_failed", logging.WARNING, verb=verb, leader=url, error=reason)
            status, kind = 503, "application/json"
            why = f"not the leader, and the leader at {url} did not answer: {reason}"
            answer = json.dumps({"Error": why}).encode()
        finally:
            connection.close()
        self.relayed.labels(verb, str(status)).inc()
        return status, kind, answer


def _left(connection: http.client.HTTPConnection, deadline: float) -> None:
    """Give the connection's next socket operation only what is left of the deadline."""
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError(f"no answer within {RELAY_TIMEOUT_SECONDS:g}s")
    if connection.sock is not None:
        connection.sock.settimeout(left)
