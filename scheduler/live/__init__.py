"""The live scheduler: Kubernetes API in, the scheduling core in the middle, bindings out."""
