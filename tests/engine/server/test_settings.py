"""``shunter engine``'s settings: --model flags and the TOML file."""

from __future__ import annotations

from pathlib import Path

import pytest

from shunter.engine.server.models import parse_model_arg
from shunter.engine.server.settings import SettingsError, check_model_dirs, load_settings


def test_model_flag_with_and_without_a_sharing_mode() -> None:
    assert parse_model_arg("a=/m/x:temporal").sharing == "temporal"
    assert parse_model_arg("a=/m/x").sharing == "spatial"
    assert parse_model_arg("a=/m/x:spatial").path == Path("/m/x")
    with pytest.raises(ValueError):
        parse_model_arg("/m/x")


def test_config_file_and_flags_combine(tmp_path: Path) -> None:
    config = tmp_path / "engine.toml"
    config.write_text(
        'policy = "fcfs"\nkv_tokens = 1024\nhbm_budget = "2G"\n'
        "[slo_classes.gold]\nttft_ms = 250\ntbt_ms = 40\n"
        '[[models]]\nname = "a"\npath = "/m/a"\nsharing = "temporal"\nslo = "gold"\n'
    )
    settings = load_settings(config, ["b=/m/b"])
    assert [m.name for m in settings.models] == ["a", "b"]
    assert settings.policy == "fcfs" and settings.kv_tokens == 1024
    assert settings.hbm_budget == 2 << 30
    slo = settings.models[0].slo
    assert slo is not None and (slo.ttft_s, slo.tbt_s) == (0.25, 0.04)
    with pytest.raises(SettingsError, match="has no config"):
        check_model_dirs(settings)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("bogus = 1\n", "unknown key 'bogus'"),
        ('policy = "best"\n[[models]]\nname = "a"\npath = "/a"\n', "policy"),
        ('[[models]]\nname = "a"\n', "needs name and path"),
        ('[[models]]\nname = "a"\npath = "/a"\nslo = "x"\n', "unknown SLO class"),
        ('[[models]]\nname = "a"\npath = "/a"\nsharing = "both"\n', "sharing"),
        ("[slo_classes.x]\nttft_ms = -1\n", "targets must be positive"),
        ("this is not toml", "engine.toml"),
        ('hbm_budget = "lots"\n[[models]]\nname = "a"\npath = "/a"\n', "hbm_budget"),
        ("", "no models"),
        ('[[models]]\nname = "a"\npath = "/a"\nmax_context = 0\n', "max_context"),
        ('[[models]]\nname = "a"\npath = "/a"\nmax_context = "8k"\n', "max_context"),
        ('async_scheduling = "yes"\n[[models]]\nname = "a"\npath = "/a"\n', "async_scheduling"),
        ('enforce_eager = 1\n[[models]]\nname = "a"\npath = "/a"\n', "enforce_eager"),
        ('kv_tokens = 0\n[[models]]\nname = "a"\npath = "/a"\n', "kv_tokens must be"),
        ('kv_tokens = -5\n[[models]]\nname = "a"\npath = "/a"\n', "kv_tokens must be"),
        ('grace_s = -1\n[[models]]\nname = "a"\npath = "/a"\n', "grace_s must be"),
        ('grace_s = inf\n[[models]]\nname = "a"\npath = "/a"\n', "grace_s must be"),
        ('step_target_ms = nan\n[[models]]\nname = "a"\npath = "/a"\n', "step_target_ms"),
    ],
)
def test_bad_config_files(tmp_path: Path, text: str, message: str) -> None:
    config = tmp_path / "engine.toml"
    config.write_text(text)
    with pytest.raises(SettingsError, match=message):
        load_settings(config, [])


def test_duplicate_names_are_refused() -> None:
    with pytest.raises(SettingsError, match="unique"):
        load_settings(None, ["a=/x", "a=/y"])


def test_the_shipped_example_config_parses() -> None:
    example = Path(__file__).resolve().parents[3] / "deploy" / "engine.toml"
    settings = load_settings(example, [])
    assert settings.remap and settings.capacity_order[0] == "free"
    assert settings.policy == "lvf+"  # the engine's default, not Algorithm 1 as published
    assert settings.prefix_caching and not settings.async_scheduling
    assert not settings.enforce_eager  # CUDA graphs where the device has them
    assert {m.sharing for m in settings.models} <= {"spatial", "temporal"}


@pytest.mark.parametrize(
    ("flag", "value", "says"),
    [
        ("--step-target-ms", "0", "expected a positive number"),
        ("--step-target-ms", "nan", "expected a positive number"),
        ("--kv-tokens", "0", "expected a positive integer"),
        ("--kv-tokens", "-5", "expected a positive integer"),
        ("--grace", "-1", "expected a number >= 0"),
    ],
)
def test_the_command_lines_numbers_are_checked_as_they_are_read(
    capsys: pytest.CaptureFixture[str], flag: str, value: str, says: str
) -> None:
    from shunter.project.cli import build_parser

    with pytest.raises(SystemExit) as e:
        build_parser().parse_args(["engine", flag, value, "--model", "m=/none"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert f"argument {flag}: {says}" in err and "Traceback" not in err


def test_a_grace_of_zero_in_the_config_file_is_kept(tmp_path: Path) -> None:
    """``grace_s = 0`` (no wait on shutdown) is a value, not a missing one."""
    config = tmp_path / "engine.toml"
    config.write_text('grace_s = 0\n[[models]]\nname = "a"\npath = "/a"\n')
    assert load_settings(config, []).grace_s == 0.0
