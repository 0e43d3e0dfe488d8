"""gRPC core settings of the shim's process, applied before ``grpc`` is first imported.

gRPC core reads ``GRPC_EXPERIMENTS`` once, when the ``grpc`` package is imported; setting it
later does nothing. So this module must not import grpc, and ``kubegpu crishim`` applies it
before it imports the server.

The shim forwards a few CRI calls a second (kubelet's status polling), each through two
connections on unix sockets. With gRPC's EventEngine endpoints (grpcio's default since 1.6x),
every read and write of a call hops between EventEngine's pool threads, the aio poller thread
and the event loop; at kubelet's low call rate each hop wakes a sleeping thread. With the
EventEngine client, listener and endpoints turned off, the poller thread does the socket I/O
itself, with about half the thread wakeups per call (seen in profiles; the node benchmark's CPU
figures, docs/performance.md "What the shim costs a node", cannot tell the difference on the
shared test machines). The timers and everything else stay as
gRPC ships them. An operator's own ``GRPC_EXPERIMENTS`` is left as it is.
"""

from __future__ import annotations

import os
from collections.abc import MutableMapping

GRPC_EXPERIMENTS = "GRPC_EXPERIMENTS"
# Experiments turned off (a leading "-" in GRPC_EXPERIMENTS); names from grpcio 1.85. A newer
# grpcio that no longer knows a name ignores it, with one log line.
SHIM_EXPERIMENTS = "-event_engine_client,-event_engine_listener,-event_engine_for_all_other_endpoints"


def apply(environ: MutableMapping[str, str] | None = None) -> bool:
    """Set the shim's ``GRPC_EXPERIMENTS`` unless the environment has one; True when set here."""
    env = os.environ if environ is None else environ
    if GRPC_EXPERIMENTS in env:
        return False
    env[GRPC_EXPERIMENTS] = SHIM_EXPERIMENTS
    return True
