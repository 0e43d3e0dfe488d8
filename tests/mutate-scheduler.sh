#!/usr/bin/env bash
# Mutation testing of the scheduling core (scheduler/core) with mutmut, against the unit tests
# listed in tests/mutmut-scheduler.cfg. Run by `make mutate-scheduler`; the score and the surviving
# mutants are recorded in docs/testing.md.
#
# The tree is copied into $MUTATE_DIR (default build/mutate-scheduler) so the run never touches the
# working tree and never meets another target's mutmut configuration. The randomized cache test
# runs with a few seeds per mutant (KUBEGPU_SOAK_* below). Prints the score per module, then the
# summary line last:  mutate-scheduler: killed K of N mutants (P%); ...
# MUTMUT_CONFIG picks another configuration (tests/mutmut-ground.cfg: the ground-floor modules the
# scheduler and the node share, moved out of scheduler/core).
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
"$mutmut" results --all true > results.txt 2>&1 || true
"$mutmut" export-cicd-stats >/dev/null 2>&1 || true
"$root/.venv/bin/python" - <<'PY'
import json
import re
from collections import Counter, defaultdict
from pathlib import Path

stats = json.loads(Path("mutants/mutmut-cicd-stats.json").read_text())
print(json.dumps(stats, sort_keys=True))
per: dict[str, Counter[str]] = defaultdict(Counter)
for line in Path("results.txt").read_text().splitlines():
    match = re.match(r"\s*((?:[a-z_0-9]+\.)*[a-z_0-9]+)\.x(?:_|ǁ)\S*: (.+)$", line)
    if match:
        per[match[1]][match[2]] += 1
caught_all = total_all = 0
for module, counts in sorted(per.items()):
    caught = counts["killed"] + counts["timeout"]  # a mutant that makes the tests hang is caught too
    total = caught + counts["survived"] + counts["no tests"] + counts["suspicious"]
    caught_all, total_all = caught_all + caught, total_all + total
    print(f"  {module}: {caught}/{total} caught ({100 * caught / max(total, 1):.1f}%), "
          f"{counts['survived']} survived, {counts['no tests']} not covered, {counts['timeout']} timed out")
if total_all == 0:
    raise SystemExit("mutate-scheduler: no mutant was tested (see the runner's error above)")
print(f"mutate-scheduler: killed {caught_all} of {total_all} mutants "
      f"({100 * caught_all / max(total_all, 1):.1f}%); every mutant: results.txt in {Path.cwd()}")
PY
