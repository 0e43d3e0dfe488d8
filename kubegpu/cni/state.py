"""What kubegpu-cni remembers between calls: one record per container (sandbox) holding VFs, and
the node-wide lock that serialises calls.

Layout under the state directory (default ``/var/lib/kubegpu/cni``, root's alone, mode 0700):

- ``lock``: ``flock``-ed for the whole of every ADD, DEL, CHECK and GC, so two pods starting at once
  never pick the same VF and a DEL never races the ADD of the same container;
- ``<container id>.json``: the record, written (atomically) before the first VF moves and updated
  once all are in, so a DEL finds every VF even when ADD died half way or the pod's network
  namespace is gone.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from typing import Any

from kubegpu.cni.protocol import IO_FAILURE, TRY_AGAIN_LATER, CniError

RECORD_VERSION = 1


@dataclass
class Attachment:
    """One VF of a container: where it came from and what it is called in the pod."""

    device: str  # RDMA device name (the allocation's id)
    pf: str  # the PF's RDMA device name
    pci: str  # the VF's PCI address
    host_ifname: str  # its netdev name on the host, restored on DEL
    pod_ifname: str  # its name in the pod
    mac: str
    pf_ifname: str
    vf_index: int
    min_mbps: int
    max_mbps: int


@dataclass
class Record:
    """A container's VFs; ``phase`` is ``attaching`` until every VF is in, then ``attached``."""

    container_id: str
    ifname: str  # CNI_IFNAME of the attachment (GC's key, with the container id)
    netns: str
    pod: str  # namespace/name
    pod_uid: str
    phase: str
    attachments: list[Attachment] = field(default_factory=list)

    def to_json(self) -> str:
        return json.dumps({"version": RECORD_VERSION, **asdict(self)}, sort_keys=True, indent=1)

    @classmethod
    def from_json(cls, text: str) -> Record:
        doc = json.loads(text)
        if not isinstance(doc, dict) or doc.pop("version", None) != RECORD_VERSION:
            raise ValueError("not a kubegpu-cni record of a known version")
        attachments = [Attachment(**a) for a in doc.pop("attachments", [])]
        return cls(**doc, attachments=attachments)


class StateDir:
    """The state directory: records by container id, and the lock."""

    def __init__(self, path: str) -> None:
        self.path = path

    def _ensure(self) -> None:
        try:
            os.makedirs(self.path, mode=0o700, exist_ok=True)
        except OSError as error:
            raise CniError(IO_FAILURE, f"state directory {self.path}: {error.strerror}") from None

    @contextmanager
    def locked(self, timeout: float) -> Iterator[None]:
        """Hold the node-wide lock; CniError(TRY_AGAIN_LATER) if another call holds it past ``timeout``."""
        self._ensure()
        fd = os.open(os.path.join(self.path, "lock"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            deadline = time.monotonic() + timeout
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except OSError as error:
                    if error.errno not in (errno.EAGAIN, errno.EACCES):
                        raise CniError(IO_FAILURE, f"lock {self.path}/lock: {error.strerror}") from None
                    if time.monotonic() >= deadline:
                        raise CniError(
                            TRY_AGAIN_LATER,
                            f"another kubegpu-cni call held {self.path}/lock for {timeout:g}s",
                        ) from None
                    time.sleep(0.05)
            yield
        finally:
            os.close(fd)  # releases the lock

    def _file(self, container_id: str) -> str:
        return os.path.join(self.path, f"{container_id}.json")

    def load(self, container_id: str) -> Record | None:
        try:
            with open(self._file(container_id)) as f:
                return Record.from_json(f.read())
        except FileNotFoundError:
            return None
        except (OSError, ValueError, TypeError) as error:
            raise CniError(IO_FAILURE, f"record of container {container_id} is unreadable: {error}") from None

    def save(self, record: Record) -> None:
        """Write ``record`` atomically (a temporary file renamed over the old one, synced)."""
        self._ensure()
        final = self._file(record.container_id)
        tmp = f"{final}.tmp"
        try:
            with open(tmp, "w") as f:
                f.write(record.to_json())
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, final)
        except OSError as error:
            raise CniError(IO_FAILURE, f"cannot write {final}: {error.strerror}") from None

    def remove(self, container_id: str) -> None:
        try:
            os.unlink(self._file(container_id))
        except FileNotFoundError:
            pass

    def records(self) -> list[Record]:
        """Every readable record; unreadable ones are skipped (``load`` names them)."""
        try:
            names = sorted(os.listdir(self.path))
        except FileNotFoundError:
            return []
        out: list[Record] = []
        for name in names:
            if name.endswith(".json"):
                try:
                    record = self.load(name[: -len(".json")])
                except CniError:
                    continue
                if record is not None:
                    out.append(record)
        return out

    def holders(self) -> dict[str, str]:
        """VF device -> the container id whose record holds it."""
        return {a.device: r.container_id for r in self.records() for a in r.attachments}

    def status_problem(self) -> str | None:
        """Why ADD could not record anything now, or None."""
        try:
            self._ensure()
        except CniError as error:
            return error.msg
        if not os.access(self.path, os.W_OK | os.X_OK):
            return f"state directory {self.path} is not writable"
        return None


def record_summary(record: Record) -> dict[str, Any]:
    """The fields a log line names."""
    return {
        "container": record.container_id,
        "pod": record.pod,
        "vfs": [a.device for a in record.attachments],
    }
