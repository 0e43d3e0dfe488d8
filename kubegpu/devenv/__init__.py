"""Development environment: real components (containerd, control plane) for tests, benchmarks, demos."""
