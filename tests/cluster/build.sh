#!/usr/bin/env bash
# Builds the Kubernetes binaries of the tests and of the local cluster (kube-apiserver,
# kube-controller-manager, kube-scheduler, kubelet, kubectl, etcd) from Go modules into a
# per-user, per-version cache. Only missing binaries are built, so a cache from before a
# binary was added gets just that one; with all of them there it does nothing.
#
#   ${KUBEGPU_TESTBIN:-${XDG_CACHE_HOME:-$HOME/.cache}/kubegpu/testbin}/
#     <k8s-version>-<etcd-version>/{kube-apiserver,kube-controller-manager,kube-scheduler,
#                                   kubelet,kubectl,etcd}
#
# Versions come from the pins in tests/cluster/go.mod (k8s.io/kubernetes) and
# tests/cluster/etcd/go.mod (go.etcd.io/etcd/server/v3); go.sum files make the build
# reproducible. kubegpu/devenv/controlplane.py computes the same directory.
# Each binary's build time is printed, so a slow step shows in CI logs.
# Environment: see tests/testbin-lib.sh.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$here/../testbin-lib.sh"

k8s_version="$(pinned_version "$here" k8s.io/kubernetes)"
etcd_version="$(pinned_version "$here/etcd" go.etcd.io/etcd/server/v3)"
if [[ -z "$k8s_version" || -z "$etcd_version" ]]; then
  echo "build.sh: cannot read the pinned versions from $here/go.mod and $here/etcd/go.mod" >&2
  exit 1
fi
dest="$testbin_root/${k8s_version}-${etcd_version}"
k8s_commands=(kube-apiserver kube-controller-manager kube-scheduler kubelet kubectl)
exit_if_built "$dest" "the Kubernetes ${k8s_version} binaries and etcd ${etcd_version}" \
  "${k8s_commands[@]}" etcd
prepare_build "$dest"

k8s_minor="${k8s_version#v1.}"; k8s_minor="${k8s_minor%%.*}"
# The version stamps the Kubernetes release build sets (hack/lib/version.sh), minus the
# commit and build date, so /version reports the release and the binaries stay reproducible.
k8s_ldflags="-s -w"
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  k8s_ldflags+=" -X ${pkg}.gitVersion=${k8s_version} -X ${pkg}.gitMajor=1"
  k8s_ldflags+=" -X ${pkg}.gitMinor=${k8s_minor} -X ${pkg}.gitTreeState=clean"
done

echo "testbin: Kubernetes ${k8s_version}, etcd ${etcd_version} -> $dest ($("$GO" version))"
# -buildvcs=false: never stamp this repository's commit into the binaries.
for cmd in "${k8s_commands[@]}"; do
  missing_or_forced "$dest/$cmd" || continue
  go_build_into "$dest" "$here" "$cmd" "k8s.io/kubernetes/cmd/$cmd" -buildvcs=false -ldflags="$k8s_ldflags"
done
if missing_or_forced "$dest/etcd"; then
  go_build_into "$dest" "$here/etcd" etcd go.etcd.io/etcd/server/v3 -buildvcs=false -ldflags="-s -w"
fi
echo "testbin: done in ${SECONDS}s"
