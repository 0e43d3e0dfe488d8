"""The Node annotations of the device publication: what the advertiser (crishim/advertiser.py)
writes and the scheduler (scheduler/live/translate.py) and ``kubegpu node check`` read.

- ``kubegpu.io/inventory``: ``{"version": INVENTORY_VERSION, "devices": [...], "topology": {...}}``;
- ``kubegpu.io/heartbeat``: RFC 3339 UTC time of the last successful publish.

The schema is docs/advertiser.md. Names only; the standard library only.
"""

from __future__ import annotations

INVENTORY_ANNOTATION = "kubegpu.io/inventory"
HEARTBEAT_ANNOTATION = "kubegpu.io/heartbeat"
INVENTORY_VERSION = 1
