#!/usr/bin/env bash
# Builds helm (helm.sh/helm/v3) from its Go module into a per-user, per-version cache, and does
# nothing when it is already there:
#
#   ${KUBEGPU_TESTBIN:-${XDG_CACHE_HOME:-$HOME/.cache}/kubegpu/testbin}/helm-<version>/helm
#
# The version is the pin of helm.sh/helm/v3 in tests/helm/go.mod; go.sum makes the build
# reproducible. tests/fixtures/helm.py (helm_binary) computes the same path.
# Environment: see tests/testbin-lib.sh.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$here/../testbin-lib.sh"
module=helm.sh/helm/v3

version="$(pinned_version "$here" "$module")"
if [[ -z "$version" ]]; then
  echo "build.sh: cannot read the pinned $module version from $here/go.mod" >&2
  exit 1
fi
dest="$testbin_root/helm-${version}"
exit_if_built "$dest" "helm ${version}" helm
prepare_build "$dest"

# helm's own release stamps (its Makefile): `helm version` names the release, and the default
# Kubernetes version of `helm template`/`helm lint` follows the client-go it is built with
# (v0.X.Y -> 1.X) instead of the source's fallback 1.20.
client_go="$(pinned_version "$here" k8s.io/client-go)"
k8s_minor="${client_go#v0.}"; k8s_minor="${k8s_minor%%.*}"
ldflags="-s -w -X ${module}/internal/version.version=${version} -X ${module}/internal/version.gitTreeState=clean"
for pkg in pkg/lint/rules pkg/chartutil; do
  ldflags+=" -X ${module}/${pkg}.k8sVersionMajor=1 -X ${module}/${pkg}.k8sVersionMinor=${k8s_minor}"
done

echo "testbin: helm ${version} -> $dest ($("$GO" version))"
go_build_into "$dest" "$here" helm "$module/cmd/helm" -buildvcs=false -ldflags="$ldflags"
echo "testbin: done in ${SECONDS}s"
