#!/usr/bin/env bash
# Builds the test control plane (kube-apiserver, kube-scheduler, etcd) from Go modules into a
# per-user, per-version cache, and does nothing when all three binaries are already there.
#
#   ${KUBEGPU_TESTBIN:-${XDG_CACHE_HOME:-$HOME/.cache}/kubegpu/testbin}/
#     <k8s-version>-<etcd-version>/{kube-apiserver,kube-scheduler,etcd}
#
# Versions come from the pins in tests/cluster/go.mod (k8s.io/kubernetes) and
# tests/cluster/etcd/go.mod (go.etcd.io/etcd/server/v3); go.sum files make the build
# reproducible. kubegpu/devenv/controlplane.py computes the same directory.
# Environment: KUBEGPU_TESTBIN (cache root), GO (go binary, default: go on PATH, else
# /usr/local/go/bin/go), KUBEGPU_TESTBIN_FORCE=1 (rebuild even when present).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
binaries=(kube-apiserver kube-scheduler etcd)

# Prints the version that go.mod in $1 requires for module $2 (either require form).
pinned_version() {
  awk -v m="$2" '$1 == m { print $2; exit }
                 $1 == "require" && $2 == m { print $3; exit }' "$1/go.mod"
}

k8s_version="$(pinned_version "$here" k8s.io/kubernetes)"
etcd_version="$(pinned_version "$here/etcd" go.etcd.io/etcd/server/v3)"
if [[ -z "$k8s_version" || -z "$etcd_version" ]]; then
  echo "build.sh: cannot read the pinned versions from $here/go.mod and $here/etcd/go.mod" >&2
  exit 1
fi
root="${KUBEGPU_TESTBIN:-${XDG_CACHE_HOME:-$HOME/.cache}/kubegpu/testbin}"
dest="$root/${k8s_version}-${etcd_version}"

all_present() {
  local b
  for b in "${binaries[@]}"; do [[ -x "$dest/$b" ]] || return 1; done
}

if [[ "${KUBEGPU_TESTBIN_FORCE:-0}" != 1 ]] && all_present; then
  echo "testbin: kube-apiserver, kube-scheduler, etcd (${k8s_version}, ${etcd_version})" \
    "already in $dest; nothing to do"
  exit 0
fi

GO="${GO:-$(command -v go || echo /usr/local/go/bin/go)}"
if [[ ! -x "$GO" ]]; then
  echo "build.sh: no Go toolchain (looked for go on PATH and /usr/local/go/bin/go)" >&2
  exit 1
fi
export CGO_ENABLED=0
k8s_minor="${k8s_version#v1.}"; k8s_minor="${k8s_minor%%.*}"
# The version stamps the Kubernetes release build sets (hack/lib/version.sh), minus the
# commit and build date, so /version reports the release and the binaries stay reproducible.
k8s_ldflags="-s -w"
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  k8s_ldflags+=" -X ${pkg}.gitVersion=${k8s_version} -X ${pkg}.gitMajor=1"
  k8s_ldflags+=" -X ${pkg}.gitMinor=${k8s_minor} -X ${pkg}.gitTreeState=clean"
done

mkdir -p "$dest"
staging="$(mktemp -d "$dest/.build.XXXXXX")"
trap 'rm -rf "$staging"' EXIT

# go_build <module dir> <ldflags> <package> <output name>: build into staging, then move into
# place, so that an interrupted build never leaves a binary that looks complete.
go_build() {
  local start=$SECONDS
  echo "testbin: building $4 ($3) ..."
  # -buildvcs=false: never stamp this repository's commit into the binaries.
  (cd "$1" && nice -n 10 "$GO" build -trimpath -buildvcs=false -ldflags="$2" \
    -o "$staging/$4" "$3")
  mv -f "$staging/$4" "$dest/$4"
  echo "testbin: built $dest/$4 in $((SECONDS - start))s"
}

echo "testbin: Kubernetes ${k8s_version}, etcd ${etcd_version} -> $dest ($("$GO" version))"
go_build "$here" "$k8s_ldflags" k8s.io/kubernetes/cmd/kube-apiserver kube-apiserver
go_build "$here" "$k8s_ldflags" k8s.io/kubernetes/cmd/kube-scheduler kube-scheduler
go_build "$here/etcd" "-s -w" go.etcd.io/etcd/server/v3 etcd
echo "testbin: done in ${SECONDS}s"
