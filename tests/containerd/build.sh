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
# Environment: see tests/testbin-lib.sh.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$here/../testbin-lib.sh"
module=github.com/containerd/containerd/v2

version="$(pinned_version "$here" "$module")"
if [[ -z "$version" ]]; then
  echo "build.sh: cannot read the pinned $module version from $here/go.mod" >&2
  exit 1
fi
dest="$testbin_root/containerd-${version}"
exit_if_built "$dest" "containerd ${version}" containerd containerd-shim-runc-v2 ctr
prepare_build "$dest"

tags="no_btrfs no_devmapper no_zfs urfave_cli_no_docs"
# containerd's own release stamps (its Makefile), so `containerd --version` names the release.
ldflags="-s -w -X ${module}/version.Version=${version} -X ${module}/version.Package=${module}"

echo "testbin: containerd ${version} -> $dest ($("$GO" version))"
go_build_into "$dest" "$here" containerd "$module/cmd/containerd" -tags "$tags" -ldflags="$ldflags"
# the shim speaks ttrpc only, as in releases
go_build_into "$dest" "$here" containerd-shim-runc-v2 "$module/cmd/containerd-shim-runc-v2" \
  -tags "$tags no_grpc" -ldflags="$ldflags"
go_build_into "$dest" "$here" ctr "$module/cmd/ctr" -tags "$tags" -ldflags="$ldflags"
echo "testbin: done in ${SECONDS}s"
