"""Reading the openb trace format (Alibaba cluster-trace-gpu-v2023) into the core's types.

Nodes: ``sn,cpu_milli,memory_mib,gpu,model``. Pods: ``name,cpu_milli,memory_mib,num_gpu,gpu_milli``
and optionally ``gpu_spec`` (allowed models separated by ``|``; empty = any); other columns
(qos, phase, timestamps) are ignored. A pod with ``num_gpu == 1`` and ``gpu_milli < 1000`` shares
one GPU; other GPU pods take ``num_gpu`` whole GPUs.
"""

from __future__ import annotations

import csv
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from kubegpu.inputfiles import MAX_TRACE_BYTES, check_input
from scheduler.core.request import MILLI, PodRequest
from scheduler.core.state import ClusterState, GpuState, NodeState
from scheduler.sim.machines import MachineError, MachineShape

DATA_DIR = Path(__file__).resolve().parent.parent / "data"
DEFAULT_NODES = DATA_DIR / "default_nodes.csv"
DEFAULT_PODS = DATA_DIR / "default_pods.csv"


class TraceError(ValueError):
    """A trace file is missing a column or has a malformed value (the message names the row)."""


@dataclass(frozen=True)
class NodeSpec:
    """One node of a trace: CPU, memory and identical GPUs of one model, and optionally the links of a
    machine shape (``scheduler.sim.machines``) among them."""

    name: str
    cpu_milli: int
    memory_mib: int
    gpus: int
    model: str
    shape: MachineShape | None = None

    def state(self) -> NodeState:
        ids = [f"{self.name}-gpu{j}" for j in range(self.gpus)]
        topology, numa = self.shape.topology(ids) if self.shape is not None else (None, [-1] * self.gpus)
        gpus = [GpuState(j, ids[j], self.model, numa=numa[j]) for j in range(self.gpus)]
        labels = {"kubernetes.io/hostname": self.name}
        if self.gpus:
            labels["kubegpu.io/gpu-model"] = self.model
        return NodeState(self.name, self.cpu_milli, self.memory_mib, gpus, labels=labels, topology=topology)


def with_shapes(nodes: Sequence[NodeSpec], shapes: Mapping[str, MachineShape | None]) -> list[NodeSpec]:
    """The nodes with the machine shape of their GPU model (none where the model has no entry).

    Raises ``MachineError`` naming the node if a node has more GPUs than its shape.
    """
    out = []
    for node in nodes:
        shape = shapes.get(node.model) if node.gpus > 1 else None
        if shape is not None and node.gpus > shape.gpus:
            raise MachineError(
                f"node {node.name}: {node.gpus} {node.model} GPUs, "
                f"but machine shape {shape.name} has {shape.gpus}"
            )
        out.append(replace(node, shape=shape))
    return out


def _rows(path: Path, required: Sequence[str]) -> Iterable[tuple[int, dict[str, str]]]:
    check_input(path, MAX_TRACE_BYTES)  # a FIFO, a device or a runaway file is refused unread
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        try:
            missing = [c for c in required if c not in (reader.fieldnames or [])]
            if missing:
                raise TraceError(f"{path}: missing column(s) {', '.join(missing)}")
            yield from enumerate(reader, start=2)
        except (csv.Error, UnicodeDecodeError) as error:  # a field beyond csv's limit, a NUL, not UTF-8
            raise TraceError(f"{path}:{reader.line_num}: not a CSV trace: {error}") from None


def _int(path: Path, line: int, row: dict[str, str], column: str) -> int:
    text = (row.get(column) or "").strip()
    try:
        return int(float(text)) if text else 0
    except ValueError:
        raise TraceError(f"{path}:{line}: column {column}: not a number: {text!r}") from None


def load_nodes(path: str | Path) -> list[NodeSpec]:
    path = Path(path)
    out = []
    for line, row in _rows(path, ("sn", "cpu_milli", "memory_mib", "gpu", "model")):
        out.append(
            NodeSpec(
                name=row["sn"].strip(),
                cpu_milli=_int(path, line, row, "cpu_milli"),
                memory_mib=_int(path, line, row, "memory_mib"),
                gpus=_int(path, line, row, "gpu"),
                model=(row.get("model") or "").strip(),
            )
        )
    if not out:
        raise TraceError(f"{path}: no nodes")
    return out


def load_pods(path: str | Path) -> list[PodRequest]:
    path = Path(path)
    out = []
    for line, row in _rows(path, ("name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli")):
        count = _int(path, line, row, "num_gpu")
        milli = _int(path, line, row, "gpu_milli") if count else 0
        if count and not 0 < milli < MILLI:
            milli = MILLI  # as the FGD simulator's converter: out-of-range milli means whole GPUs
        if count > 1 and milli < MILLI:
            raise TraceError(
                f"{path}:{line}: a share of {milli} milli on {count} GPUs (shares are of one GPU)"
            )
        models = frozenset(m for m in (row.get("gpu_spec") or "").split("|") if m.strip())
        out.append(
            PodRequest(
                name=row["name"].strip(),
                cpu_milli=_int(path, line, row, "cpu_milli"),
                memory_mib=_int(path, line, row, "memory_mib"),
                gpu_count=count,
                gpu_milli=milli,
                gpu_models=models,
            )
        )
    if not out:
        raise TraceError(f"{path}: no pods")
    return out


def build_cluster(nodes: Sequence[NodeSpec]) -> ClusterState:
    """A fresh, empty cluster of these nodes."""
    return ClusterState(spec.state() for spec in nodes)
