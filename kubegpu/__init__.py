"""kubegpu: place Kubernetes pods on specific devices and guarantee each container gets them."""

__version__ = "0.1.0"
