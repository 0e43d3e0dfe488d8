"""The scheduling core: pure, in-memory, no Kubernetes imports.

- ``request``: ``PodRequest`` (CPU, memory, whole or fractional GPUs, models, topology wishes,
  node selector, tolerations);
- ``state``: ``NodeState`` / ``ClusterState`` (with vectorised per-node arrays) and ``Allocation``;
- ``filters``: filter plugins with failure reasons and the "0/N nodes are available" message;
- ``topology``: topology-aware choice of whole GPUs (go-gpuallocator link scores, looking ahead);
- ``besteffort``: go-gpuallocator's best-effort policy, reimplemented for comparison;
- ``allocate``: the devices a pod gets on its node;
- ``scoring`` / ``policies``: score plugins, weighted policies, the policy registry;
- ``frag``: the fragmentation measure behind FGD;
- ``schedule``: ``schedule_one``;
- ``gang``: ``schedule_group``, a pod group placed whole or not at all (on ``schedule_one``).
"""

from scheduler.core.allocate import allocate, best_fit_share_gpu
from scheduler.core.filters import (
    DEFAULT_FILTERS,
    FilterPlugin,
    failed_nodes,
    run_filters,
    unschedulable_message,
)
from scheduler.core.policies import DEFAULT_POLICY, POLICIES, make_policy, policy_names
from scheduler.core.request import (
    MILLI,
    ContainerRequest,
    PodRequest,
    Taint,
    TaintEffect,
    Toleration,
    TopologyWish,
    Wish,
)
from scheduler.core.schedule import Placement, Unschedulable, schedule_one
from scheduler.core.scoring import Policy, ScorePlugin
from scheduler.core.state import Allocation, AllocationConflict, ClusterState, GpuGrant, GpuState, NodeState

__all__ = [
    "DEFAULT_FILTERS",
    "DEFAULT_POLICY",
    "MILLI",
    "POLICIES",
    "Allocation",
    "AllocationConflict",
    "ClusterState",
    "ContainerRequest",
    "FilterPlugin",
    "GpuGrant",
    "GpuState",
    "NodeState",
    "Placement",
    "PodRequest",
    "Policy",
    "ScorePlugin",
    "Taint",
    "TaintEffect",
    "Toleration",
    "TopologyWish",
    "Unschedulable",
    "Wish",
    "allocate",
    "best_fit_share_gpu",
    "failed_nodes",
    "make_policy",
    "policy_names",
    "run_filters",
    "schedule_one",
    "unschedulable_message",
]
