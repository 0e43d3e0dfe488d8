"""kubegpu-cni: a chained CNI plugin that moves a pod's allocated RDMA VF netdevs into its network
namespace (docs/cni.md).

- ``protocol``: the CNI request, config fields, error codes and results (pure);
- ``podalloc``: the pod's signed allocation, from the runtime's annotations or the API;
- ``state``: the per-container records and the node-wide lock;
- ``links``: netlink moves and the bandwidth appliers (pyroute2);
- ``plugin``: the commands; ``main``: the executable.
"""
