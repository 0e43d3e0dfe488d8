"""Mutation testing with mutmut, in a scratch copy of the repository (``make mutate-node``).

mutmut (3.x) reads its settings from the working directory's pyproject.toml and writes its
``mutants/`` tree there. To keep both out of the repository, and so that several mutation
targets (node, scheduler) never share settings, each run works in ``build/mutate-<name>/``: a
copy of the packages and tests, with a pyproject.toml holding only the pytest settings and this
run's ``[tool.mutmut]``. It prints the score (in all and per module) and every surviving
mutant's diff, and writes them to ``build/mutate-<name>/report.txt``.

    python -m kubegpu.devenv.mutate node --mutate crishim/ledger.py ... --tests tests/test_x.py ...
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# deploy: tests/test_sched_extender.py (in make mutate-live's selection) loads the shipped manifests
PACKAGES = ("crishim", "deploy", "devices", "kubegpu", "scheduler", "tests", "tools")


def _toml_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return str(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    raise TypeError(f"cannot write {value!r} as TOML")


def prepare(workdir: Path, mutate: list[str], tests: list[str], pytest_args: list[str]) -> None:
    """A fresh scratch copy with this run's settings (mutmut's own cache is dropped too)."""
    if workdir.exists():
        shutil.rmtree(workdir)
    workdir.mkdir(parents=True)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", ".pytest_cache")
    for package in PACKAGES:
        shutil.copytree(REPO / package, workdir / package, ignore=ignore, symlinks=True)
    pytest_settings = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    sources = sorted({path.split("/", 1)[0] for path in mutate})
    lines = ["[tool.pytest.ini_options]"]
    lines += [f"{key} = {_toml_value(value)}" for key, value in pytest_settings.items() if key != "testpaths"]
    lines += [
        "",
        "[tool.mutmut]",
        f"source_paths = {_toml_value(sources)}",
        f"only_mutate = {_toml_value(mutate)}",
        f"pytest_add_cli_args_test_selection = {_toml_value(tests)}",
        f"pytest_add_cli_args = {_toml_value(['-q', '-p', 'no:cacheprovider', *pytest_args])}",
        f"also_copy = {_toml_value([p for p in PACKAGES if p not in sources])}",
    ]
    (workdir / "pyproject.toml").write_text("\n".join(lines) + "\n")
    # mutmut imports the tests from mutants/, which it makes later: the directory must exist when
    # Python starts, or the import system caches it as missing (PYTHONPATH names it).
    (workdir / "mutants").mkdir()


def run(workdir: Path, jobs: int) -> int:
    env = {**os.environ, "PYTHONPATH": str(workdir / "mutants")}
    mutmut = [sys.executable, "-m", "mutmut"]
    with open(workdir / "run.log", "w") as log:
        done = subprocess.run(
            [*mutmut, "run", "--max-children", str(jobs)], cwd=workdir, env=env, stdout=log, stderr=log
        )
    if done.returncode not in (0, 1):  # 1: some mutants survived, which is a result, not an error
        print(f"mutate: mutmut run failed ({done.returncode}), see {workdir / 'run.log'}", file=sys.stderr)
        return done.returncode
    results = subprocess.run(
        [*mutmut, "results", "--all", "true"], cwd=workdir, env=env, capture_output=True, text=True
    )
    statuses: dict[str, list[str]] = {}
    for line in results.stdout.splitlines():
        name, sep, status = line.strip().rpartition(": ")
        if sep:
            statuses.setdefault(status, []).append(name)
    killed = len(statuses.get("killed", []))
    total = sum(len(v) for v in statuses.values())
    counts = {status: len(names) for status, names in sorted(statuses.items())}
    survivors = [n for s, names in statuses.items() if s not in ("killed", "skipped") for n in names]
    score = f"{100 * killed / max(total, 1):.1f}%"
    report = [f"mutants: {total}, killed: {killed} ({score}), by status: {counts}"]
    report += per_module(statuses)
    for name in sorted(survivors):
        shown = subprocess.run([*mutmut, "show", name], cwd=workdir, env=env, capture_output=True, text=True)
        report += ["", f"--- {name} ({_status_of(name, statuses)})", shown.stdout.strip()]
    text = "\n".join(report) + "\n"
    (workdir / "report.txt").write_text(text)
    print(text)
    return 0


def module_of(name: str) -> str:
    """The module of a mutant's name (``pkg.mod.x_func__mutmut_3``, ``pkg.mod.xǁClassǁmethod__mutmut_1``)."""
    match = re.match(r"(.+?)\.x[_ǁ]", name)
    return match[1] if match else name


def per_module(statuses: dict[str, list[str]]) -> list[str]:
    """One line per mutated module: its mutants, killed, and the other statuses by count."""
    modules: dict[str, Counter[str]] = {}
    for status, names in statuses.items():
        for name in names:
            modules.setdefault(module_of(name), Counter())[status] += 1
    lines = []
    for module, counts in sorted(modules.items()):
        total, killed = sum(counts.values()), counts["killed"]
        others = ", ".join(f"{status} {n}" for status, n in sorted(counts.items()) if status != "killed")
        lines.append(
            f"  {module}: {total} mutants, killed {killed} ({100 * killed / max(total, 1):.1f}%)"
            + (f"; {others}" if others else "")
        )
    return lines


def _status_of(name: str, statuses: dict[str, list[str]]) -> str:
    return next(status for status, names in statuses.items() if name in names)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kubegpu.devenv.mutate", description=__doc__)
    parser.add_argument("name", help="the run's name: its scratch copy is build/mutate-NAME")
    parser.add_argument("--mutate", nargs="+", required=True, help="source files to mutate")
    parser.add_argument("--tests", nargs="+", required=True, help="test files that may kill mutants")
    parser.add_argument("--pytest-arg", action="append", default=[], help="extra pytest argument")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args(argv)
    missing = [p for p in [*args.mutate, *args.tests] if not (REPO / p).exists()]
    if missing:
        print(f"mutate: no such file: {', '.join(missing)}", file=sys.stderr)
        return 2
    workdir = REPO / "build" / f"mutate-{args.name}"
    prepare(workdir, args.mutate, args.tests, args.pytest_arg)
    return run(workdir, args.jobs)


if __name__ == "__main__":
    sys.exit(main())
