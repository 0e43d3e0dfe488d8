#!/usr/bin/env bash
# Mutation testing of the scheduling core (scheduler/core) with mutmut, against the unit tests
# listed in tests/mutmut-scheduler.cfg. Run by `make mutate-scheduler`; the score and the surviving
# mutants are recorded in docs/testing.md.
#
# The tree is copied into $MUTATE_DIR (default build/mutate-scheduler) so the run never touches the
# working tree and never meets another target's mutmut configuration. The randomized cache test
# runs with a few seeds per mutant (KUBEGPU_SOAK_* below). Prints the summary line last:
#   mutate-scheduler: killed K of N mutants (P%), S survived, T timed out
set -euo pipefail
root=${KUBEGPU_ROOT:-$(cd "$(dirname "$0")/.." && pwd)}
if [ ! -d "$root/scheduler/core" ] || [ ! -x "$root/.venv/bin/python" ]; then
    echo "mutate-scheduler: $root is not a kubegpu checkout with .venv (run make install)" >&2
    exit 2
fi
work=${MUTATE_DIR:-$root/build/mutate-scheduler}
jobs=${MUTATE_JOBS:-2}
mutmut="$root/.venv/bin/mutmut"

rm -rf "$work"
mkdir -p "$work"
tar -C "$root" --exclude=./.venv --exclude=./build --exclude=./.git --exclude=./mutants \
    --exclude='__pycache__' --exclude=.pytest_cache --exclude=.ruff_cache -cf - . | tar -C "$work" -xf -
cp "${MUTMUT_CONFIG:-$root/tests/mutmut-scheduler.cfg}" "$work/setup.cfg"
cd "$work"
export KUBEGPU_SOAK_SEEDS=${KUBEGPU_SOAK_SEEDS:-3} KUBEGPU_SOAK_STEPS=${KUBEGPU_SOAK_STEPS:-300}
nice -n 10 "$mutmut" run --max-children "$jobs" || true
"$mutmut" results --all true > results.txt 2>&1 || "$mutmut" results > results.txt 2>&1 || true
"$mutmut" export-cicd-stats >/dev/null 2>&1 || true
"$root/.venv/bin/python" - <<'PY'
import json
from pathlib import Path

stats = json.loads(Path("mutants/mutmut-cicd-stats.json").read_text())
killed, survived = stats.get("killed", 0), stats.get("survived", 0)
timeout, suspicious = stats.get("timeout", 0), stats.get("suspicious", 0)
no_tests, skipped = stats.get("no_tests", 0), stats.get("skipped", 0)
total = killed + survived + timeout + suspicious + no_tests
caught = killed + timeout  # a mutant that makes the tests hang is caught too
print(json.dumps(stats, sort_keys=True))
print(f"mutate-scheduler: killed {caught} of {total} mutants ({100 * caught / max(total, 1):.1f}%), "
      f"{survived} survived, {no_tests} not covered, {timeout} timed out (counted as killed); "
      f"survivors: build/mutate-scheduler/results.txt")
PY
