"""The ``kubegpu-cni`` executable: the runtime runs it with CNI_* in the environment and the network
config on stdin; it prints the result (or a CNI error object) on stdout and logs JSON lines on
stderr. Exit status 0 on success, 1 on a CNI error.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from collections.abc import Mapping
from typing import Any

from kubegpu.cni.protocol import SUPPORTED_VERSIONS, CniError, parse_request
from kubegpu.logs import configure, log_event

INTERNAL_ERROR = 199  # an unexpected failure (a bug): the message names the exception

log = logging.getLogger("kubegpu.cni")


def _version_of(stdin: bytes) -> str:
    """The config's cniVersion for an error document, when it can be read."""
    try:
        version = json.loads(stdin).get("cniVersion")
    except (ValueError, AttributeError, RecursionError):
        version = None
    return version if isinstance(version, str) and version else SUPPORTED_VERSIONS[-1]


def execute(env: Mapping[str, str], stdin: bytes) -> tuple[int, dict[str, Any] | None]:
    """The exit status and the document to print for one call."""
    from kubegpu.cni.plugin import run  # after logging is set up: it imports pyroute2

    try:
        request = parse_request(env, stdin)
        return 0, run(request)
    except CniError as error:
        log_event(
            log,
            "cni.error",
            logging.WARNING,
            command=env.get("CNI_COMMAND"),
            container=env.get("CNI_CONTAINERID"),
            code=error.code,
            error=error.msg,
        )
        return 1, error.to_document(_version_of(stdin))
    except Exception as error:  # a bug must still answer in CNI's format
        log.exception("cni.internal_error")
        failure = CniError(INTERNAL_ERROR, f"internal error: {type(error).__name__}: {error}")
        return 1, failure.to_document(_version_of(stdin))


def main() -> int:
    configure(os.environ.get("KUBEGPU_CNI_LOG_LEVEL", "info"))
    status, document = execute(os.environ, sys.stdin.buffer.read())
    if document is not None:
        sys.stdout.write(json.dumps(document) + "\n")
        sys.stdout.flush()
    return status


if __name__ == "__main__":
    sys.exit(main())
