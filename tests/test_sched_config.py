"""The scheduler's config file: defaults, the shipped manifest, and errors that name the key."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from scheduler.core.policies import policy_names
from scheduler.live.config import ConfigError, SchedulerConfig, load_config, validate

DEPLOY_CONFIG = Path(__file__).resolve().parents[1] / "deploy" / "20-scheduler-config.yaml"


def test_the_shipped_config_map_loads(tmp_path: Path) -> None:
    manifest = yaml.safe_load(DEPLOY_CONFIG.read_text())
    path = tmp_path / "scheduler.yaml"
    path.write_text(manifest["data"]["scheduler.yaml"])
    config = load_config(path)
    assert config.leader_election.enabled and config.leader_election.lease_name == "kubegpu-scheduler"
    assert config.policy in policy_names() and SchedulerConfig().policy in policy_names()


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("schedulerName: 5\n", "schedulerName must be"),
        ("bindWorkers: true\n", "bindWorkers must be"),
        ("leaderElection: yes\n", "leaderElection must be a mapping"),
        ("leaderElection: {leaseSecs: 3}\n", "unknown key 'leaseSecs'"),
        ("clientQPS: 50\n", "unknown key 'clientQPS'"),
        ("- a\n- b\n", "top level must be a mapping"),
        ("a: [\n", "cannot read"),
    ],
)
def test_bad_files_name_the_problem(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "scheduler.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message):
        load_config(path)


def test_numbers_and_defaults(tmp_path: Path) -> None:
    path = tmp_path / "scheduler.yaml"
    path.write_text("heartbeatStaleSeconds: 60\nleaderElection: {leaseSeconds: 3}\n")
    config = load_config(path)
    assert config.heartbeat_stale_seconds == 60.0 and config.leader_election.lease_seconds == 3.0
    assert load_config(None) == SchedulerConfig(identity=config.identity)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("gangDomainLabel: ''\n", "gangDomainLabel '' is not a label key"),
        ("gangDomainLabel: 'a b'\n", "gangDomainLabel 'a b' is not a label key"),
        ("gangDomainLabel: 'Rack.example/x'\n", "is not a label key"),
        ("gangTimeoutSeconds: 0\n", "gangTimeoutSeconds must be more than 0"),
        ("gangStarvationSeconds: -1\n", "gangStarvationSeconds must be more than 0"),
    ],
)
def test_gang_settings_are_checked(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "scheduler.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message):
        validate(load_config(path))


def test_gang_settings_load(tmp_path: Path) -> None:
    path = tmp_path / "scheduler.yaml"
    path.write_text(
        "gangTimeoutSeconds: 30\ngangDomainLabel: example.com/rack\ngangStarvationSeconds: 600\n"
        "gangMemberGraceSeconds: 2.5\n"
    )
    config = load_config(path)
    validate(config)
    assert (
        config.gang_timeout_seconds,
        config.gang_domain_label,
        config.gang_starvation_seconds,
        config.gang_member_grace_seconds,
    ) == (30.0, "example.com/rack", 600.0, 2.5)
    path.write_text("gangMemberGraceSeconds: 0\n")
    with pytest.raises(ConfigError, match="gangMemberGraceSeconds must be more than 0"):
        validate(load_config(path))
