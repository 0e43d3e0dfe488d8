"""Build tooling that is not part of the installed product (the scheduler image builder)."""
