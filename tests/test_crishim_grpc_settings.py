"""The shim's gRPC core settings: set before grpc is imported, an operator's own value kept."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from crishim import grpc_settings

REPO = Path(__file__).resolve().parent.parent

# Run ``kubegpu crishim`` in a fresh interpreter and report GRPC_EXPERIMENTS at the moment the
# first grpc module is imported (then exit: nothing is served).
FIRST_GRPC_IMPORT = """
import builtins, os, sys
real = builtins.__import__
def spy(name, *args, **kwargs):
    if name == "grpc" or name.startswith("grpc."):
        print("GRPC_EXPERIMENTS=" + os.environ.get("GRPC_EXPERIMENTS", "<unset>"), flush=True)
        os._exit(0)
    return real(name, *args, **kwargs)
builtins.__import__ = spy
from kubegpu import cli
cli.main(["crishim", "--listen", "unix:///nonexistent/kubegpu-test.sock"])
print("grpc was never imported", flush=True)
"""


def first_grpc_import(env: dict[str, str]) -> str:
    result = subprocess.run(
        [sys.executable, "-c", FIRST_GRPC_IMPORT], cwd=REPO, env=env, capture_output=True, text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


def test_apply_sets_the_experiments_when_the_environment_has_none() -> None:
    env: dict[str, str] = {}
    assert grpc_settings.apply(env) is True
    assert env == {"GRPC_EXPERIMENTS": grpc_settings.SHIM_EXPERIMENTS}
    assert all(name.startswith("-event_engine_") for name in grpc_settings.SHIM_EXPERIMENTS.split(","))


def test_an_operators_own_setting_is_kept_even_when_empty() -> None:
    for own in ("event_engine_client", ""):
        env = {"GRPC_EXPERIMENTS": own}
        assert grpc_settings.apply(env) is False
        assert env == {"GRPC_EXPERIMENTS": own}


def test_the_settings_module_does_not_import_grpc() -> None:
    code = "import sys; import crishim.grpc_settings; print('grpc' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "False", out.stderr


def test_kubegpu_crishim_sets_the_experiments_before_grpc_is_first_imported() -> None:
    env = {k: v for k, v in os.environ.items() if k != "GRPC_EXPERIMENTS"}
    assert first_grpc_import(env) == f"GRPC_EXPERIMENTS={grpc_settings.SHIM_EXPERIMENTS}"
    assert first_grpc_import({**env, "GRPC_EXPERIMENTS": "-event_engine_dns"}) == (
        "GRPC_EXPERIMENTS=-event_engine_dns"
    )
