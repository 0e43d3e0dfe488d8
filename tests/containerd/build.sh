#!/usr/bin/env bash
# Builds containerd 2.x (containerd, containerd-shim-runc-v2, ctr) from Go modules into a
# per-user, per-version cache, and does nothing when all three binaries are already there.
#
#   ${KUBEGPU_TESTBIN:-${XDG_CACHE_HOME:-$HOME/.cache}/kubegpu/testbin}/
#     containerd-<version>/{containerd,containerd-shim-runc-v2,ctr}
#
# Debian's containerd 1.6 stays the default runtime of the tests; this one serves the CRI
# calls 1.6 does not implement (GetContainerEvents). The version is the pin of
# github.com/containerd/containerd/v2 in tests/containerd/go.mod; go.sum makes the build
# reproducible. kubegpu/devenv/containerd.py (containerd2_bin_dir) computes the same directory.
# The binaries are static (CGO_ENABLED=0): without cgo the btrfs snapshotter drops out by
# itself, and the tags below leave out the other snapshotters the tests never use. runc
# comes from the system (Debian's runc 1.1.5 works with containerd 2.x).
# Environment: KUBEGPU_TESTBIN (cache root), GO (go binary, default: go on PATH, else
# /usr/local/go/bin/go), KUBEGPU_TESTBIN_FORCE=1 (rebuild even when present).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
module=github.com/containerd/containerd/v2
binaries=(containerd containerd-shim-runc-v2 ctr)

version="$(awk -v m="$module" '$1 == m { print $2; exit }
                               $1 == "require" && $2 == m { print $3; exit }' "$here/go.mod")"
if [[ -z "$version" ]]; then
  echo "build.sh: cannot read the pinned $module version from $here/go.mod" >&2
  exit 1
fi
root="${KUBEGPU_TESTBIN:-${XDG_CACHE_HOME:-$HOME/.cache}/kubegpu/testbin}"
dest="$root/containerd-${version}"

all_present() {
  local b
  for b in "${binaries[@]}"; do [[ -x "$dest/$b" ]] || return 1; done
}

if [[ "${KUBEGPU_TESTBIN_FORCE:-0}" != 1 ]] && all_present; then
  echo "testbin: containerd ${version} already in $dest; nothing to do"
  exit 0
fi

GO="${GO:-$(command -v go || echo /usr/local/go/bin/go)}"
if [[ ! -x "$GO" ]]; then
  echo "build.sh: no Go toolchain (looked for go on PATH and /usr/local/go/bin/go)" >&2
  exit 1
fi
export CGO_ENABLED=0
tags="no_btrfs no_devmapper no_zfs urfave_cli_no_docs"
# containerd's own release stamps (its Makefile), so `containerd --version` names the release.
ldflags="-s -w -X ${module}/version.Version=${version} -X ${module}/version.Package=${module}"

mkdir -p "$dest"
staging="$(mktemp -d "$dest/.build.XXXXXX")"
trap 'rm -rf "$staging"' EXIT

# go_build <binary> <extra tags>: build into staging, then move into place, so that an
# interrupted build never leaves a binary that looks complete.
go_build() {
  local start=$SECONDS
  echo "testbin: building $1 ..."
  (cd "$here" && nice -n 10 "$GO" build -trimpath -tags "$tags $2" -ldflags="$ldflags" \
    -o "$staging/$1" "$module/cmd/$1")
  mv -f "$staging/$1" "$dest/$1"
  echo "testbin: built $dest/$1 in $((SECONDS - start))s"
}

echo "testbin: containerd ${version} -> $dest ($("$GO" version))"
go_build containerd ""
go_build containerd-shim-runc-v2 "no_grpc"  # the shim speaks ttrpc only, as in releases
go_build ctr ""
echo "testbin: done in ${SECONDS}s"
