"""Settings loading: defaults < TOML [common]+[section] < env DUALPATH_* < overrides, and a bad
setting fails naming its key (shared/config.py plus every service's validate())."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import pytest

from shared.config import ConfigError, load_config, read_toml, require

pytestmark = pytest.mark.unit


@dataclass(frozen=True)
class Demo:
    name: str = "default"
    port: int = 8000
    ratio: float = 0.5
    flag: bool = False
    hosts: tuple[str, ...] = ("a",)
    ports: tuple[int, ...] = ()
    limit: int | None = None
    label: str | None = "x"


@dataclass(frozen=True)
class Validated:
    size: int = 1

    def validate(self) -> None:
        require(self.size > 0, "size", self.size, "must be > 0")


def toml(tmp_path, text: str):
    path = tmp_path / "dualpath.toml"
    path.write_text(text)
    return path


def load(cls=Demo, section="demo", **kw):
    kw.setdefault("env", {})
    return load_config(cls, section, **kw)


# --- precedence ----------------------------------------------------------------------------

def test_defaults_apply_when_nothing_is_set():
    assert load() == Demo()


def test_ambient_process_environment_is_not_read_when_env_is_given(monkeypatch):
    monkeypatch.setenv("DUALPATH_PORT", "1234")
    assert load(env={}).port == 8000
    assert load_config(Demo, "demo").port == 1234  # env=None means os.environ


def test_toml_common_table_applies_to_every_section(tmp_path):
    f = toml(tmp_path, '[common]\nname = "shared"\n[other]\nport = 1\n')
    cfg = load(file=f)
    assert cfg.name == "shared" and cfg.port == 8000


def test_toml_service_table_overrides_common(tmp_path):
    f = toml(tmp_path, '[common]\nname = "shared"\nport = 1\n[demo]\nname = "mine"\n')
    cfg = load(file=f)
    assert (cfg.name, cfg.port) == ("mine", 1)


def test_env_overrides_toml(tmp_path):
    f = toml(tmp_path, "[demo]\nport = 1\nratio = 0.25\n")
    cfg = load(file=f, env={"DUALPATH_PORT": "2"})
    assert (cfg.port, cfg.ratio) == (2, 0.25)


def test_overrides_beat_env_and_toml(tmp_path):
    f = toml(tmp_path, "[demo]\nport = 1\n")
    cfg = load(file=f, env={"DUALPATH_PORT": "2"}, overrides={"port": "3"})
    assert cfg.port == 3


def test_none_override_means_not_given_and_keeps_lower_layers():
    cfg = load(env={"DUALPATH_PORT": "2"}, overrides={"port": None, "name": None})
    assert (cfg.port, cfg.name) == (2, "default")


def test_env_variables_without_a_matching_field_are_ignored():
    # DUALPATH_CONFIG names the file; it is not a field and must not be an error
    assert load(env={"DUALPATH_CONFIG": "x.toml", "DUALPATH_NOPE": "1"}) == Demo()


def test_env_key_is_upper_case_field_name_with_prefix():
    assert load(env={"dualpath_port": "5", "PORT": "6"}).port == 8000
    assert load(env={"DUALPATH_PORT": "5"}).port == 5


def test_empty_file_argument_means_no_file():
    assert read_toml(None, "demo") == ({}, {}) and read_toml("", "demo") == ({}, {})


def test_common_keys_another_service_uses_are_skipped(tmp_path):
    f = toml(tmp_path, '[common]\nmodel = "tiny"\nport = 3\n')
    assert load(file=f).port == 3  # `model` belongs to other services: not an error here


def test_unknown_key_in_the_service_table_is_an_error(tmp_path):
    f = toml(tmp_path, '[demo]\nmodel = "tiny"\n')
    with pytest.raises(ConfigError) as info:
        load(file=f)
    assert info.value.key == "demo.model"


# --- types -----------------------------------------------------------------------------

@pytest.mark.parametrize("text,value", [
    ("1", True), ("true", True), ("TRUE", True), ("yes", True), (" on ", True),
    ("0", False), ("false", False), ("No", False), ("off", False),
])
def test_boolean_spellings_from_env(text, value):
    assert load(env={"DUALPATH_FLAG": text}).flag is value


def test_toml_boolean_is_taken_as_is(tmp_path):
    assert load(file=toml(tmp_path, "[demo]\nflag = true\n")).flag is True


@pytest.mark.parametrize("text", ["maybe", "2", "", "tru"])
def test_bad_boolean_names_the_env_key(text):
    with pytest.raises(ConfigError) as info:
        load(env={"DUALPATH_FLAG": text})
    assert info.value.key == "DUALPATH_FLAG" and info.value.value == text
    assert "DUALPATH_FLAG" in str(info.value)


@pytest.mark.parametrize("raw", ["abc", "1.5", "", "0x10"])
def test_non_integer_text_for_int_field_is_rejected(raw):
    with pytest.raises(ConfigError) as info:
        load(overrides={"port": raw})
    assert info.value.key == "port" and info.value.value == raw


def test_int_field_accepts_surrounding_whitespace_and_sign():
    assert load(overrides={"port": " -7 "}).port == -7


def test_toml_boolean_for_int_field_is_rejected(tmp_path):
    with pytest.raises(ConfigError) as info:
        load(file=toml(tmp_path, "[demo]\nport = true\n"))
    assert info.value.key == "demo.port"


def test_toml_fractional_float_for_int_field_is_rejected_not_truncated(tmp_path):
    with pytest.raises(ConfigError) as info:
        load(file=toml(tmp_path, "[demo]\nport = 8000.7\n"))
    assert info.value.key == "demo.port"


def test_toml_integral_float_for_int_field_is_accepted(tmp_path):
    cfg = load(file=toml(tmp_path, "[demo]\nport = 8001.0\n"))
    assert cfg.port == 8001 and type(cfg.port) is int


def test_toml_boolean_for_float_field_is_rejected(tmp_path):
    with pytest.raises(ConfigError) as info:
        load(file=toml(tmp_path, "[demo]\nratio = true\n"))
    assert info.value.key == "demo.ratio"


def test_float_field_parses_text_and_toml_ints(tmp_path):
    assert load(env={"DUALPATH_RATIO": "2.5"}).ratio == 2.5
    cfg = load(file=toml(tmp_path, "[demo]\nratio = 3\n"))
    assert cfg.ratio == 3.0 and type(cfg.ratio) is float


def test_bad_float_names_the_key():
    with pytest.raises(ConfigError) as info:
        load(env={"DUALPATH_RATIO": "fast"})
    assert info.value.key == "DUALPATH_RATIO"


def test_str_field_rejects_a_toml_table(tmp_path):
    with pytest.raises(ConfigError) as info:
        load(file=toml(tmp_path, "[demo]\nname = {a = 1}\n"))
    assert info.value.key == "demo.name"


def test_str_field_takes_numbers_as_text(tmp_path):
    assert load(file=toml(tmp_path, "[demo]\nname = 42\n")).name == "42"


def test_tuple_from_comma_separated_env_strips_and_skips_empty_items():
    cfg = load(env={"DUALPATH_HOSTS": " a , b,,c ", "DUALPATH_PORTS": "1, 2"})
    assert cfg.hosts == ("a", "b", "c")
    assert cfg.ports == (1, 2)


def test_tuple_from_toml_array_coerces_each_element(tmp_path):
    cfg = load(file=toml(tmp_path, '[demo]\nhosts = ["x", "y"]\nports = [1, 2, 3]\n'))
    assert cfg.hosts == ("x", "y") and cfg.ports == (1, 2, 3)
    assert isinstance(cfg.hosts, tuple) and isinstance(cfg.ports, tuple)


def test_empty_env_tuple_is_empty():
    assert load(env={"DUALPATH_HOSTS": ""}).hosts == ()


def test_bad_tuple_element_names_the_key():
    with pytest.raises(ConfigError) as info:
        load(env={"DUALPATH_PORTS": "1,two"})
    assert info.value.key == "DUALPATH_PORTS"


def test_bad_tuple_element_reason_points_at_the_element():
    with pytest.raises(ConfigError) as info:
        load(env={"DUALPATH_PORTS": "1, 2,two"})
    assert info.value.value == "1, 2,two"
    assert "`int`" in info.value.reason and "$[2]" in info.value.reason


@pytest.mark.parametrize("raw,value", [("1", True), ("0", False)])
def test_toml_integer_for_bool_field_reads_as_its_spelling(tmp_path, raw, value):
    assert load(file=toml(tmp_path, f"[demo]\nflag = {raw}\n")).flag is value


def test_toml_other_integer_for_bool_field_is_rejected(tmp_path):
    with pytest.raises(ConfigError) as info:
        load(file=toml(tmp_path, "[demo]\nflag = 2\n"))
    assert info.value.key == "demo.flag" and info.value.value == 2


def test_scalar_toml_value_for_tuple_field_is_rejected(tmp_path):
    with pytest.raises(ConfigError) as info:
        load(file=toml(tmp_path, "[demo]\nports = 5\n"))
    assert info.value.key == "demo.ports"


@pytest.mark.parametrize("text", ["", "none", "None", "NULL"])
def test_optional_field_takes_none_spellings(text):
    cfg = load(env={"DUALPATH_LIMIT": text, "DUALPATH_LABEL": text})
    assert cfg.limit is None and cfg.label is None


def test_optional_field_coerces_inner_type():
    assert load(env={"DUALPATH_LIMIT": "12"}).limit == 12


def test_optional_field_still_rejects_bad_inner_value():
    with pytest.raises(ConfigError) as info:
        load(env={"DUALPATH_LIMIT": "many"})
    assert info.value.key == "DUALPATH_LIMIT"


def test_non_optional_str_keeps_none_spelling_as_text():
    assert load(env={"DUALPATH_NAME": "none"}).name == "none"


# --- unknown keys, files -----------------------------------------------------------------

def test_unknown_toml_key_names_section_and_key(tmp_path):
    with pytest.raises(ConfigError) as info:
        load(file=toml(tmp_path, "[demo]\nprot = 1\n"))
    assert info.value.key == "demo.prot" and info.value.reason == "unknown setting"


def test_unknown_key_in_other_sections_is_not_our_business(tmp_path):
    assert load(file=toml(tmp_path, "[elsewhere]\nprot = 1\n")) == Demo()


def test_unknown_override_names_the_key():
    with pytest.raises(ConfigError) as info:
        load(overrides={"prot": 1})
    assert info.value.key == "prot"


def test_missing_file_is_a_config_error_naming_config(tmp_path):
    missing = tmp_path / "nope.toml"
    with pytest.raises(ConfigError) as info:
        load(file=missing)
    assert info.value.key == "config" and info.value.value == str(missing)
    assert "not found" in info.value.reason


def test_invalid_toml_is_a_config_error_naming_config(tmp_path):
    with pytest.raises(ConfigError) as info:
        load(file=toml(tmp_path, "[demo\nport = \n"))
    assert info.value.key == "config" and "TOML" in info.value.reason


def test_config_error_is_a_value_error_with_fields():
    err = ConfigError("k", 3, "why")
    assert isinstance(err, ValueError)
    assert (err.key, err.value, err.reason) == ("k", 3, "why")
    assert str(err) == "bad setting k=3: why"


def test_loaded_config_is_frozen():
    cfg = load()
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.port = 1  # type: ignore[misc]


# --- validate() -------------------------------------------------------------------------

def test_validate_runs_after_loading():
    with pytest.raises(ConfigError) as info:
        load(Validated, "v", overrides={"size": "0"})
    assert info.value.key == "size" and info.value.value == 0


def test_validate_sees_the_final_merged_values(tmp_path):
    # TOML sets a bad value, env repairs it: validate only sees the result
    cfg = load(Validated, "v", file=toml(tmp_path, "[v]\nsize = 0\n"), env={"DUALPATH_SIZE": "3"})
    assert cfg.size == 3


def test_require_passes_silently_when_condition_holds():
    assert require(True, "k", 1, "never") is None
