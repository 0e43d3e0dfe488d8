# Shared by tests/cluster/build.sh and tests/containerd/build.sh (sourced, not run): the cache
# layout, version pins, "already built" check, Go lookup and the staging-then-move build step.
# Environment: KUBEGPU_TESTBIN (cache root), GO (go binary, default: go on PATH, else
# /usr/local/go/bin/go), KUBEGPU_TESTBIN_FORCE=1 (rebuild even when present).

# The per-user cache root; kubegpu/devenv/controlplane.py (testbin_root) computes the same.
testbin_root="${KUBEGPU_TESTBIN:-${XDG_CACHE_HOME:-$HOME/.cache}/kubegpu/testbin}"

# Prints the version that go.mod in $1 requires for module $2 (either require form).
pinned_version() {
  awk -v m="$2" '$1 == m { print $2; exit }
                 $1 == "require" && $2 == m { print $3; exit }' "$1/go.mod"
}

# exit_if_built <dest> <what> <binary>...: stop the script (status 0) when every binary is there.
exit_if_built() {
  local dest="$1" what="$2" b
  shift 2
  [[ "${KUBEGPU_TESTBIN_FORCE:-0}" == 1 ]] && return 0
  for b in "$@"; do [[ -x "$dest/$b" ]] || return 0; done
  echo "testbin: $what already in $dest; nothing to do"
  exit 0
}

# missing_or_forced <binary path>: true when it must be built (absent, or KUBEGPU_TESTBIN_FORCE=1).
missing_or_forced() {
  [[ "${KUBEGPU_TESTBIN_FORCE:-0}" == 1 || ! -x "$1" ]]
}

# prepare_build <dest>: find Go (sets GO), build static, and make an empty staging dir (sets
# staging, removed on exit).
prepare_build() {
  GO="${GO:-$(command -v go || echo /usr/local/go/bin/go)}"
  if [[ ! -x "$GO" ]]; then
    echo "build.sh: no Go toolchain (looked for go on PATH and /usr/local/go/bin/go)" >&2
    exit 1
  fi
  export CGO_ENABLED=0
  mkdir -p "$1"
  staging="$(mktemp -d "$1/.build.XXXXXX")"
  trap 'rm -rf "$staging"' EXIT
}

# go_build_into <dest> <module dir> <output name> <package> [go build flags...]: build into the
# staging dir, then move into place, so an interrupted build never leaves a binary that looks
# complete.
go_build_into() {
  local dest="$1" dir="$2" name="$3" package="$4" start=$SECONDS
  shift 4
  echo "testbin: building $name ($package) ..."
  (cd "$dir" && nice -n 10 "$GO" build -trimpath "$@" -o "$staging/$name" "$package")
  mv -f "$staging/$name" "$dest/$name"
  echo "testbin: built $dest/$name in $((SECONDS - start))s"
}
