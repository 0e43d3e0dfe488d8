"""``make image``: the kubegpu scheduler image, built from Debian packages and PyPI wheels with no
container registry, written as a reproducible OCI image tar (docs/install.md, "The image")."""
