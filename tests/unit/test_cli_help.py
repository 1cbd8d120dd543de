"""`--help` everywhere: every flag has a line of help and shows its default; renamed flags
keep working with a note."""
from __future__ import annotations

import argparse
import dataclasses
import re

import pytest

from dualpath.cli import CliError, HelpFormatter, build_parser
from services.decode_engine.config import DecodeEngineConfig
from services.prefill_engine.config import PrefillEngineConfig
from services.scheduler.config import SchedulerConfig
from services.storage_gateway.config import StorageGatewayConfig
from services.traffic_manager.config import TrafficManagerConfig
from shared.service_config import config_parser

pytestmark = pytest.mark.unit


def _parsers(parser: argparse.ArgumentParser, path: str = "dualpath"):
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _parsers(sub, f"{path} {name}")


PARSERS = list(_parsers(build_parser()))


def test_the_tree_has_every_tool():
    names = {p for p, _ in PARSERS}
    assert {"dualpath up", "dualpath service", "dualpath sim", "dualpath bench", "dualpath plan pd"} <= names


@pytest.mark.parametrize("path,parser", PARSERS, ids=[p for p, _ in PARSERS])
def test_every_flag_has_help_and_its_default_is_shown(path, parser):
    text = re.sub(r"\s+", " ", parser.format_help())
    for action in parser._actions:
        if not action.option_strings or isinstance(action, argparse._HelpAction):
            continue
        assert (action.help or "").strip(), f"{path} {action.option_strings[0]} has no help"
        default = action.default
        if default not in (None, False, "", [], argparse.SUPPRESS) or type(default) in (int, float):
            assert f"(default: {default})" in text or "default" in action.help, \
                f"{path} {action.option_strings[0]}: default {default!r} not shown"


def test_the_formatter_shows_zero_defaults_but_not_absent_ones():
    p = argparse.ArgumentParser(formatter_class=HelpFormatter)
    p.add_argument("--seed", type=int, default=0, help="a seed")
    p.add_argument("--json", help="write here")
    p.add_argument("--quiet", action="store_true", help="less")
    text = p.format_help()
    assert "a seed (default: 0)" in text
    assert "write here (default" not in text and "less (default" not in text


@pytest.mark.parametrize("cls", [SchedulerConfig, PrefillEngineConfig, DecodeEngineConfig, TrafficManagerConfig, StorageGatewayConfig],
                         ids=lambda c: c.__name__)
def test_every_service_setting_flag_says_what_it_does_its_default_and_env(cls):
    parser = config_parser("prog", cls)
    by_dest = {a.dest: a for a in parser._actions}
    for f in dataclasses.fields(cls):
        text = by_dest[f.name].help
        assert f"env DUALPATH_{f.name.upper()})" in text and "(default: " in text, f.name
        meaning = text.split(" (default: ")[0]
        assert meaning and meaning != f.name.replace("_", " "), f"{f.name}: give the field a # comment"


def test_secrets_are_not_shown_as_defaults():
    import shared.runtime as rt

    @dataclasses.dataclass(frozen=True)
    class WithSecret(rt.CommonConfig):
        key: str = dataclasses.field(default="s3cret", repr=False)  # an API key

    assert "s3cret" not in config_parser("prog", WithSecret).format_help()


def _bench_args(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(["bench", "--trace", "gen:32k", "--offline", *argv])


def test_the_old_snic_flag_still_works_and_says_it_is_deprecated(capsys):
    from dualpath.bench.cli import _snic_flag

    args = _bench_args("--snic-gbs", "0.17")
    _snic_flag(args)
    assert args.snic_gbit == 0.17
    assert "--snic-gbs is deprecated, use --snic-gbit" in capsys.readouterr().err
    args = _bench_args("--snic-gbit", "0.2")
    _snic_flag(args)
    assert args.snic_gbit == 0.2 and capsys.readouterr().err == ""


def test_old_and_new_snic_flags_that_disagree_are_refused():
    from dualpath.bench.cli import _snic_flag

    with pytest.raises(CliError, match="disagree"):
        _snic_flag(_bench_args("--snic-gbs", "0.1", "--snic-gbit", "0.2"))
