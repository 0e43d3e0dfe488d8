"""Device discovery and description: the model, the node topology, and the device plugins."""
