"""The local cluster: a one-node (or few-node) GPU Kubernetes cluster on this machine.

``kubegpu up`` / ``kubegpu down`` (``make demo``), the node fixtures of the end-to-end tests and
``bench/node_overhead.py`` all run the same pieces:

* ``processes``: records of the daemons it starts, and the sweep that proves nothing is left;
* ``namespace``: the private mount namespace a node runs in (its own /var/lib and /var/log, the
  kernel tunables kubelet writes shadowed, so the host is never changed);
* ``kubelet``: kubelet's configuration and process, with a node client certificate;
* ``node``: one node: containerd, the CRI proxy in front of it (the kubegpu shim, none, or a
  peer proxy) and kubelet, all inside the node's namespace;
* ``cluster``: etcd, kube-apiserver (Node,RBAC authorization, NodeRestriction),
  kube-controller-manager, the kubegpu scheduler and the nodes, under one state directory;
* ``workload`` and ``cli``: the demo's mixed workload, its report, and the ``up``/``down``
  subcommands.

docs/local-cluster.md describes it for users.
"""
