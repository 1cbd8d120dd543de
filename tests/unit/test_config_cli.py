"""CLI flags generated from a config dataclass (shared/service_config.config_parser); no network."""
from __future__ import annotations

import dataclasses

import pytest

from services.decode_engine.config import DecodeEngineConfig
from services.prefill_engine.config import PrefillEngineConfig
from services.scheduler.config import SchedulerConfig
from services.storage_gateway.config import StorageGatewayConfig
from services.traffic_manager.config import TrafficManagerConfig
from shared.config import ConfigError, load_config
from shared.service_config import CommonConfig, config_parser

pytestmark = pytest.mark.unit

CONFIGS = [CommonConfig, SchedulerConfig, PrefillEngineConfig, DecodeEngineConfig, TrafficManagerConfig, StorageGatewayConfig]


def flag(name: str) -> str:
    return "--" + name.replace("_", "-")


@pytest.mark.parametrize("cls", CONFIGS, ids=lambda c: c.__name__)
def test_every_config_field_becomes_a_dashed_flag(cls):
    parser = config_parser("prog", cls)
    for f in dataclasses.fields(cls):
        args = parser.parse_args([flag(f.name), "v1"])
        assert getattr(args, f.name) == "v1", f.name


@pytest.mark.parametrize("cls", CONFIGS, ids=lambda c: c.__name__)
def test_unset_flags_are_none_so_lower_layers_win(cls):
    args = config_parser("prog", cls).parse_args([])
    assert all(getattr(args, f.name) is None for f in dataclasses.fields(cls))
    assert args.config is None


def test_nats_is_an_alias_of_nats_url():
    parser = config_parser("prog", CommonConfig)
    assert parser.parse_args(["--nats", "nats://a:1"]).nats_url == "nats://a:1"
    assert parser.parse_args(["--nats-url", "nats://b:2"]).nats_url == "nats://b:2"


def test_config_flag_names_the_toml_file():
    args = config_parser("prog", SchedulerConfig).parse_args(["--config", "x.toml", "--http-port", "9"])
    assert (args.config, args.http_port) == ("x.toml", "9")


def test_unknown_flag_exits_with_usage_error(capsys):
    with pytest.raises(SystemExit) as info:
        config_parser("prog", SchedulerConfig).parse_args(["--no-such-flag", "1"])
    assert info.value.code == 2
    assert "--no-such-flag" in capsys.readouterr().err


def test_flag_values_flow_through_load_config_as_overrides():
    args = config_parser("prog", DecodeEngineConfig).parse_args(["--kv-blocks", "32", "--max-running", "4", "--node", "n3"])
    overrides = {k: v for k, v in vars(args).items() if k != "config" and v is not None}
    cfg = load_config(DecodeEngineConfig, "decode_engine", env={}, overrides=overrides)
    assert (cfg.kv_blocks, cfg.max_running, cfg.node) == (32, 4, "n3")


def test_bad_flag_value_fails_naming_the_field():
    args = config_parser("prog", DecodeEngineConfig).parse_args(["--max-running", "0"])
    overrides = {k: v for k, v in vars(args).items() if k != "config" and v is not None}
    with pytest.raises(ConfigError) as info:
        load_config(DecodeEngineConfig, "decode_engine", env={}, overrides=overrides)
    assert info.value.key == "max_running"
