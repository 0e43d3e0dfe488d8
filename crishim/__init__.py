"""The CRI shim: a gRPC proxy between kubelet and containerd that rewrites CreateContainer."""
