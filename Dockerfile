# The kubegpu image, for anyone with a registry:
#   docker build -t kubegpu:0.1.0 --label org.opencontainers.image.source=<repository URL> \
#       --label org.opencontainers.image.revision=$(git rev-parse HEAD) .
# (source and revision are labels only when known: no placeholder URL, no "unknown" revision.)
# `make image` builds the equivalent image with no registry, from Debian packages and the same
# locked wheels (tools/image/build.py; docs/install.md). Keep the two in step:
# tests/test_image.py compares this file with the image `make image` builds.
# amd64 only: tools/image/requirements.lock pins the x86_64 wheels.
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

# The project's wheel, with the CRI stubs and NRI messages generated from proto/ (they are not in git).
FROM ${PYTHON_IMAGE} AS wheel
WORKDIR /src
COPY . .
RUN pip install --no-cache-dir "grpcio-tools>=1.66" "setuptools>=68" \
 && python -m grpc_tools.protoc -Icrishim/cri=proto/runtime/v1 --python_out=. --grpc_python_out=. \
        crishim/cri/api.proto \
 && python -m grpc_tools.protoc -Icrishim/nri=proto/nri --python_out=. crishim/nri/api.proto crishim/nri/ttrpc.proto \
 && pip wheel --no-cache-dir --no-deps --no-build-isolation -w /dist .

FROM ${PYTHON_IMAGE}
ARG VERSION=0.1.0
LABEL org.opencontainers.image.title="kubegpu" \
      org.opencontainers.image.description="kubegpu: topology-aware device scheduler, CRI shim and node agent" \
      org.opencontainers.image.version="${VERSION}"
# The root filesystem is read-only in the pod: never try to write bytecode.
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
COPY tools/image/requirements.lock /tmp/requirements.lock
COPY --from=wheel /dist/ /tmp/dist/
# The locked dependencies, then the project; no bytecode, no test suites, no pip in the result.
RUN pip install --no-cache-dir --no-compile --require-hashes -r /tmp/requirements.lock \
 && pip install --no-cache-dir --no-compile --no-deps /tmp/dist/kubegpu-*.whl \
 && pip uninstall --yes --quiet pip setuptools wheel \
 && find /usr/local/lib/python3.11/site-packages -mindepth 2 -type d \( -name tests -o -name test \) \
        -prune -exec rm -rf {} + \
 && rm -rf /tmp/requirements.lock /tmp/dist /root/.cache \
 && groupadd --gid 65532 nonroot \
 && useradd --uid 65532 --gid 65532 --home-dir /home/nonroot --create-home --shell /usr/sbin/nologin nonroot
USER 65532:65532
ENTRYPOINT ["kubegpu"]
