"""GPU topology for the simulator's nodes: which machine shape (NVLink and PCIe layout) each GPU model gets.

Trace nodes (openb) name only a GPU model and a GPU count. To say anything about link quality the
simulator gives every node the links of a real machine shape from ``devices/topologies``:
``DEFAULT_SHAPES`` maps each openb GPU model to one (documented in docs/simulator.md, with the
reasons), and ``kubegpu simulate --machine MODEL=SHAPE`` replaces or adds entries, SHAPE being a
shipped name (``dgx1-v100``), a machine JSON file of the same format, or ``none``. A node with fewer
GPUs than its shape gets the shape's first GPUs (a 4-GPU V100 node is one socket of a DGX-1, a
2-GPU T4 node one PCIe switch of ``pcie-4gpu``); a node with more GPUs than its shape is an error.
Models without an entry get no link information (the scheduler then treats their GPUs as equal).
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from devices.model import PCIeRelation, Topology, pair

SHIPPED_DIR = Path(__file__).resolve().parent.parent.parent / "devices" / "topologies"

# openb GPU model -> shipped machine shape. V100 SXM2 (16 and 32 GB) and P100 SXM2 boards are the
# DGX-1 hybrid cube-mesh; the undisclosed 8-GPU models G2 (96 CPUs) and G3 (128 CPUs) are assumed
# to be of the same NVLink generation as the V100 boards (cube-mesh; override with --machine);
# T4 and A10 are PCIe cards without NVLink.
DEFAULT_SHAPES: dict[str, str] = {
    "V100M16": "dgx1-v100",
    "V100M32": "dgx1-v100",
    "P100": "dgx1-v100",
    "G1": "dgx1-v100",
    "G2": "dgx1-v100",
    "G3": "dgx1-v100",
    "T4": "pcie-4gpu",
    "A10": "pcie-4gpu",
}


class MachineError(ValueError):
    """A machine shape that cannot be read or does not fit a node (the message says which)."""


@dataclass(frozen=True)
class MachineShape:
    """The links of one machine: NVLink counts and PCIe relations by GPU index, NUMA per GPU."""

    name: str
    nvlink: tuple[tuple[int, ...], ...]
    pcie: tuple[tuple[PCIeRelation | None, ...], ...]
    numa: tuple[int, ...]

    @property
    def gpus(self) -> int:
        return len(self.numa)

    def topology(self, ids: Sequence[str]) -> tuple[Topology, list[int]]:
        """The links among this shape's first ``len(ids)`` GPUs, named by ``ids``; and their NUMA nodes."""
        n = len(ids)
        if n > self.gpus:
            raise MachineError(f"machine shape {self.name} has {self.gpus} GPUs, the node has {n}")
        nvlinks: dict[tuple[str, str], int] = {}
        pcie: dict[tuple[str, str], PCIeRelation] = {}
        for i, j in itertools.combinations(range(n), 2):
            if self.nvlink[i][j]:
                nvlinks[pair(ids[i], ids[j])] = self.nvlink[i][j]
            rel = self.pcie[i][j]
            if rel is not None:
                pcie[pair(ids[i], ids[j])] = rel
        return Topology(nvlinks, pcie), list(self.numa[:n])


def _square(name: str, key: str, rows: Any, n: int) -> list[list[Any]]:
    """``rows`` as an n x n symmetric matrix (the rules of devices/topologies files)."""
    square = isinstance(rows, list) and len(rows) == n
    if not square or any(not isinstance(r, list) or len(r) != n for r in rows):
        raise MachineError(f"machine shape {name}: {key} must be a {n}x{n} matrix")
    for i, j in itertools.combinations(range(n), 2):
        if rows[i][j] != rows[j][i]:
            raise MachineError(f"machine shape {name}: {key}[{i}][{j}] != {key}[{j}][{i}]")
    return rows


def parse_shape(name: str, doc: Mapping[str, Any]) -> MachineShape:
    """A machine shape from a machine JSON document (``gpus``, ``nvlink``, optional ``pcie``).

    The rules of ``devices/topologies`` files: GPUs listed by index 0..n-1, square symmetric
    matrices, NVLink counts whole numbers >= 0 (0 on the diagonal), PCIe relations by name ('X' on
    the diagonal). Anything else is a ``MachineError`` naming the entry.
    """
    gpus = doc.get("gpus")
    if not isinstance(gpus, list) or not gpus:
        raise MachineError(f"machine shape {name}: 'gpus' must be a non-empty list")
    indices = [g.get("index") if isinstance(g, dict) else None for g in gpus]
    if indices != list(range(len(gpus))):
        raise MachineError(
            f"machine shape {name}: gpus must be listed by index 0..{len(gpus) - 1}, got {indices}"
        )
    n = len(gpus)
    nvlink = _square(name, "nvlink", doc.get("nvlink", [[0] * n for _ in range(n)]), n)
    for i in range(n):
        for j in range(n):
            v = nvlink[i][j]
            if isinstance(v, bool) or not isinstance(v, int) or v < 0 or (i == j and v):
                what = "0" if i == j else "a whole count >= 0"
                raise MachineError(f"machine shape {name}: nvlink[{i}][{j}] must be {what}, not {v!r}")
    raw = doc.get("pcie")
    pcie: list[tuple[PCIeRelation | None, ...]] = []
    if raw is None:
        pcie = [(None,) * n for _ in range(n)]
    else:
        rows = _square(name, "pcie", raw, n)
        for i in range(n):
            if str(rows[i][i]).upper() != "X":
                raise MachineError(f"machine shape {name}: pcie[{i}][{i}] must be 'X'")
            row: list[PCIeRelation | None] = []
            for j in range(n):
                if i == j:
                    row.append(None)
                    continue
                try:
                    row.append(PCIeRelation.parse(str(rows[i][j])))
                except ValueError as exc:
                    raise MachineError(f"machine shape {name}: pcie[{i}][{j}]: {exc}") from None
            pcie.append(tuple(row))
    numa: list[int] = []
    for i, g in enumerate(gpus):
        value = g.get("numa", -1)
        if isinstance(value, bool) or not isinstance(value, int):
            raise MachineError(f"machine shape {name}: gpus[{i}].numa must be an integer, not {value!r}")
        numa.append(value)
    return MachineShape(name=name, nvlink=tuple(tuple(r) for r in nvlink), pcie=tuple(pcie), numa=tuple(numa))


def load_shape(spec: str) -> MachineShape | None:
    """A shipped shape by name, a machine JSON file by path, or None for ``none``."""
    if spec.lower() == "none":
        return None
    path = Path(spec)
    if not path.suffix and (SHIPPED_DIR / f"{spec}.json").is_file():
        path = SHIPPED_DIR / f"{spec}.json"
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        shipped = ", ".join(sorted(p.stem for p in SHIPPED_DIR.glob("*.json")))
        raise MachineError(f"no machine shape {spec!r} (a file, or one of: {shipped}, none)") from None
    except (OSError, ValueError) as exc:
        raise MachineError(f"cannot read machine shape {spec!r}: {exc}") from None
    if not isinstance(doc, dict):
        raise MachineError(f"machine shape {spec!r}: not a JSON object")
    return parse_shape(path.stem, doc)


def parse_mapping(entries: Sequence[str]) -> dict[str, str]:
    """``MODEL=SHAPE`` entries (later ones win) over ``DEFAULT_SHAPES``."""
    mapping = dict(DEFAULT_SHAPES)
    for entry in entries:
        model, sep, shape = entry.partition("=")
        if not sep or not model.strip() or not shape.strip():
            raise MachineError(f"--machine wants MODEL=SHAPE, not {entry!r}")
        mapping[model.strip()] = shape.strip()
    return mapping


def resolve(mapping: Mapping[str, str]) -> dict[str, MachineShape | None]:
    """Load every shape a mapping names (each once)."""
    loaded: dict[str, MachineShape | None] = {}
    out: dict[str, MachineShape | None] = {}
    for model, spec in mapping.items():
        if spec not in loaded:
            loaded[spec] = load_shape(spec)
        out[model] = loaded[spec]
    return out
