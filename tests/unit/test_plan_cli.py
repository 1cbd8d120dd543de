"""`dualpath plan` CLI: tables, --json and clear errors naming bad values."""
from __future__ import annotations

import json

import pytest

from dualpath.cli import main

pytestmark = pytest.mark.unit


def run(capsys, *argv):
    code = main(["plan", *argv])
    return code, capsys.readouterr().out


@pytest.mark.parametrize("argv", [
    ["pd", "--gpus-per-node", "8", "--snic", "1", "--cnic-gbs", "50", "--dram-gbs", "500"],
    ["attention", "--model", "qwen2.5-32b", "--cards", "8", "--batch", "64", "--ctx", "8192"],
    ["moe", "--model", "ds-27b", "--ep", "16", "--batch", "128"],
    ["capacity", "--model", "ds-v3", "--cards", "32", "--hbm", "80"],
    ["cp", "--model", "llama-3-70b", "--cards", "8", "--seq", "32768"],
    ["pp", "--layers", "61", "--stages", "4", "--tail", "0.5", "--chunks", "4", "--seq", "8192"],
])
def test_every_subcommand_prints_table_and_json(capsys, argv):
    code, text = run(capsys, *argv)
    assert code == 0 and ("---" in text or "B_memory" in text)
    code, out = run(capsys, *argv, "--json")
    assert code == 0 and isinstance(json.loads(out), dict)


def test_attention_json_has_layouts_and_recommendation(capsys):
    _, out = run(capsys, "attention", "--model", "ds-v3", "--cards", "32", "--batch", "256",
                 "--ctx", "8192", "--json")
    data = json.loads(out)
    assert data["recommended_tp"] == 2 and len(data["layouts"]) == 6


def test_pd_marks_both_bounds_that_tie_at_the_papers_upper_end(capsys):
    _, text = run(capsys, "pd", "--gpus-per-node", "8", "--snic", "1", "--cnic-gbs", "50",
                  "--dram-gbs", "500")
    assert "upper end by DE CNIC write and DE DRAM" in text and text.count("binds") == 3


def test_pp_json_gives_the_split_with_the_fastest_slowest_stage(capsys):
    _, out = run(capsys, "pp", "--layers", "61", "--stages", "4", "--tail", "0.5", "--json")
    stages = json.loads(out)["stages"]
    assert stages["layers"] == [17, 17, 17, 10] and max(stages["times"]) == 17.625


def test_model_path_works(capsys, tmp_path):
    from dualpath.presets import load_config
    path = tmp_path / "config.json"
    path.write_text(json.dumps(load_config("llama-3-70b")[1]))
    code, out = run(capsys, "attention", "--model", str(path), "--cards", "8", "--batch", "8",
                    "--ctx", "1024")
    assert code == 0 and "GQA" in out


@pytest.mark.parametrize("argv,needle", [
    (["attention", "--model", "nope", "--cards", "8", "--batch", "8", "--ctx", "8"], "nope"),
    (["attention", "--model", "ds-v3", "--cards", "-3", "--batch", "8", "--ctx", "8"], "-3"),
    (["moe", "--model", "qwen2.5-32b", "--ep", "8", "--batch", "8"], "dense"),
    (["pp", "--layers", "4", "--stages", "8"], "stages"),
    (["capacity", "--model", "ds-v3", "--cards", "6", "--hbm", "80", "--attn-tp", "4"], "divide"),
    (["pd", "--gpus-per-node", "x", "--snic", "1", "--cnic-gbs", "1", "--dram-gbs", "1"], "'x'"),
])
def test_bad_values_exit_2_naming_the_value(capsys, argv, needle):
    with pytest.raises(SystemExit) as exc:
        main(["plan", *argv])
    assert exc.value.code == 2
    assert needle in capsys.readouterr().err
