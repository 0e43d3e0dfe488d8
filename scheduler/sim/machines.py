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


def parse_shape(name: str, doc: Mapping[str, Any]) -> MachineShape:
    """A machine shape from a machine JSON document (``gpus``, ``nvlink``, ``pcie``)."""
    try:
        gpus = sorted(doc["gpus"], key=lambda g: int(g["index"]))
        n = len(gpus)
        nvlink = doc.get("nvlink", [[0] * n] * n)
        pcie = doc.get("pcie")
        if len(nvlink) != n or any(len(r) != n for r in nvlink):
            raise MachineError(f"machine shape {name}: nvlink must be a {n}x{n} matrix")
        if pcie is not None and (len(pcie) != n or any(len(r) != n for r in pcie)):
            raise MachineError(f"machine shape {name}: pcie must be a {n}x{n} matrix")
        if any(int(v) < 0 for r in nvlink for v in r):
            raise MachineError(f"machine shape {name}: negative NVLink count")
        return MachineShape(
            name=name,
            nvlink=tuple(tuple(int(v) for v in r) for r in nvlink),
            pcie=tuple(
                tuple(None if pcie is None or i == j else PCIeRelation.parse(str(r[j])) for j in range(n))
                for i, r in enumerate(pcie if pcie is not None else [[None] * n] * n)
            ),
            numa=tuple(int(g.get("numa", -1)) for g in gpus),
        )
    except MachineError:
        raise
    except (KeyError, TypeError, ValueError) as exc:
        raise MachineError(f"machine shape {name}: malformed ({exc})") from None


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
