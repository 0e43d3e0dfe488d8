"""A minimal read-only OCI distribution registry on loopback, so CRI PullImage can be tested.

It serves the manifests and blobs of images built by ``images.py`` under ``/v2/<name>/...``
with the headers containerd's resolver expects. Nothing is pushed; it exists for tests only.
"""

from __future__ import annotations

import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from kubegpu.devenv.images import Blob, Image

_PATH = re.compile(r"^/v2/(?P<name>.+)/(?P<kind>manifests|blobs)/(?P<ref>[^/]+)$")


class LocalRegistry:
    """Serve a fixed set of images at http://127.0.0.1:<port>."""

    def __init__(self, images: list[Image]) -> None:
        self._manifests: dict[tuple[str, str], Blob] = {}
        self._blobs: dict[str, Blob] = {}
        for image in images:
            repo, tag = self.split_ref(image.ref)
            self._manifests[(repo, tag)] = image.manifest
            self._manifests[(repo, image.manifest.digest)] = image.manifest
            self._blobs.update(image.blobs)
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler_class())
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @staticmethod
    def split_ref(ref: str) -> tuple[str, str]:
        """Split 'host/repo/name:tag' into ('repo/name', 'tag')."""
        _host, _, rest = ref.partition("/")
        repo, _, tag = rest.rpartition(":")
        return repo, tag

    @property
    def host(self) -> str:
        """host:port of the registry."""
        return f"127.0.0.1:{self._server.server_address[1]}"

    def start(self) -> LocalRegistry:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def lookup(self, path: str) -> Blob | None:
        match = _PATH.match(path.split("?", 1)[0])  # mirrors add ?ns=<original host>
        if match is None:
            return None
        if match["kind"] == "manifests":
            return self._manifests.get((match["name"], match["ref"]))
        return self._blobs.get(match["ref"])

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        registry = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: object) -> None:  # noqa: A002
                return

            def _respond(self, with_body: bool) -> None:
                if self.path.split("?", 1)[0] in ("/v2", "/v2/"):
                    self.send_response(200)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                blob = registry.lookup(self.path)
                if blob is None:
                    self.send_response(404)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                self.send_response(200)
                self.send_header("Content-Type", blob.media_type)
                self.send_header("Content-Length", str(len(blob.data)))
                self.send_header("Docker-Content-Digest", blob.digest)
                self.end_headers()
                if with_body:
                    self.wfile.write(blob.data)

            def do_GET(self) -> None:  # noqa: N802
                self._respond(with_body=True)

            def do_HEAD(self) -> None:  # noqa: N802
                self._respond(with_body=False)

        return Handler
