"""A reimplementation of NVIDIA go-gpuallocator's best-effort policy, the reference for whole-GPU choice.

kubegpu's scheduler does not use it: ``topology.best_gpu_set`` is our choice. This module exists so
the node-placement benchmark (``bench/node_placement.py``) and the tests can compare against what
NVIDIA's device plugin would choose, from its published algorithm (written from its description,
not its code):

- Every way of splitting the available GPUs (by ascending index) into sets of ``size`` is
  enumerated, the list padded with empty slots to a multiple of ``size``; a set holds either no
  padding or all of it. Partitions are generated with the first remaining GPU always in the next
  set and the rest of that set taken in lexicographic order, recursively.
- A partition's score is the sum of its sets' link scores (``topology.pair_score``: 100 per NVLink
  plus the PCIe relation); padding scores 0. Only partitions with a padding-free set containing every
  required GPU count; the first partition of the highest score wins.
- Of that partition's sets containing the required GPUs, the first one of the highest link score
  is returned.

Like the original it enumerates every partition (105 for pairs of 8 GPUs, exponential in the GPU
count), so it is meant for machines of up to about 10 GPUs; results are memoised per (free set, size,
wishes, required set) on the node's ``LinkMatrix``.

Two things it leaves undefined are settled here and documented as such. go-gpuallocator can return
a set holding padding when a padded remainder outscores every full set of the best partition (its
``Allocator`` then panics); we return the best full set of that partition instead. It takes no
topology wishes; ``wish`` extends its own "required" mechanism: only partitions with a full set
meeting the REQUIRE wishes count, and only such sets are returned.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator, Sequence

from scheduler.core.request import TopologyWish, Wish
from scheduler.core.topology import NO_WISH, Choice, LinkMatrix, checked_free

_Group = tuple[int | None, ...]


def _partitions(devices: list[int | None], size: int, padding: int) -> Iterator[list[_Group]]:
    """Partitions of ``devices`` into groups of ``size`` in go-gpuallocator's order."""
    if len(devices) == size:
        yield [tuple(devices)]
        return
    first = devices[0]
    for combo in itertools.combinations(devices[1:], size - 1):
        group = (first, *combo)
        pads = sum(1 for d in group if d is None)
        if pads not in (0, padding):
            continue
        remaining = [d for d in devices if d not in group]  # a padded group takes all the padding
        for rest in _partitions(remaining, size, padding):
            yield [group, *rest]


def _group_score(links: LinkMatrix, group: _Group) -> int:
    return links.set_score(g for g in group if g is not None)


def gpuallocator_gpu_set(
    links: LinkMatrix,
    free: Iterable[int],
    size: int,
    wish: TopologyWish = NO_WISH,
    must: Iterable[int] = (),
) -> Choice:
    """go-gpuallocator best-effort's choice of ``size`` GPUs among ``free``, containing ``must``.

    None where it returns no devices (size 0 is the empty set and a negative size None, as
    ``best_gpu_set``; a free index outside the machine is a ``ValueError`` as there).
    """
    available = checked_free(links, free)
    required = sorted(set(must))
    if size < 0:
        return None
    if size == 0:
        return () if not required else None
    if len(available) < size or len(required) > size or len(required) > len(available):
        return None
    if size == 1 or not wish.required():
        wish = NO_WISH
    key = ("besteffort", tuple(available), size, wish, tuple(required))
    memo = links.memo
    if key in memo:
        return memo[key]
    result = _allocate(links, available, size, wish, required)
    memo[key] = result
    return result


def _acceptable(links: LinkMatrix, group: _Group, wish: TopologyWish, required: Sequence[int]) -> bool:
    """A full set (no padding) with every required GPU that meets the REQUIRE wishes."""
    if any(d is None for d in group) or not set(required) <= set(group):
        return False
    need = links.required_count(wish)
    return not need or links.satisfies([d for d in group if d is not None], wish, Wish.REQUIRE) >= need


def _allocate(
    links: LinkMatrix, available: list[int], size: int, wish: TopologyWish, required: list[int]
) -> Choice:
    if size == 1:  # every partition scores 0: the first acceptable GPU
        return next(((g,) for g in available if _acceptable(links, (g,), wish, required)), None)
    devices: list[int | None] = list(available)
    while len(devices) % size:
        devices.append(None)
    padding = len(devices) - len(available)
    best: list[_Group] | None = None
    best_score = 0
    for partition in _partitions(devices, size, padding):
        if not any(_acceptable(links, g, wish, required) for g in partition):
            continue
        score = sum(_group_score(links, g) for g in partition)
        if best is None or score > best_score:
            best, best_score = partition, score
    if best is None:
        return None
    chosen: _Group | None = None
    chosen_score = -1
    for group in best:
        if not _acceptable(links, group, wish, required):
            continue  # (go-gpuallocator would consider a padded group too; see the module docstring)
        score = _group_score(links, group)
        if score > chosen_score:
            chosen, chosen_score = group, score
    return tuple(sorted(g for g in chosen if g is not None)) if chosen is not None else None
