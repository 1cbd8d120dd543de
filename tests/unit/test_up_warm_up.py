"""`dualpath up`'s warm-up request: small enough to store nothing, and authorised where the
scheduler requires an API key."""
from __future__ import annotations

import pytest

from dualpath.mesh import MeshSpec
from dualpath.up import WARM_UP, _api_key

pytestmark = pytest.mark.unit


def test_the_warm_up_prompt_and_answer_fit_in_one_partial_block_so_nothing_is_stored():
    from shared.model.tokenizer_build import tiny_tokenizer

    tok = tiny_tokenizer()
    prompt = tok.encode(tok.apply_chat_template(WARM_UP["messages"]))
    assert len(prompt) + WARM_UP["max_tokens"] < MeshSpec().block_size  # no full block: none persisted
    assert WARM_UP["temperature"] == 0


def test_the_warm_up_carries_one_of_the_schedulers_api_keys(monkeypatch):
    monkeypatch.delenv("DUALPATH_CONFIG", raising=False)
    monkeypatch.delenv("DUALPATH_API_KEYS", raising=False)
    assert _api_key() is None
    monkeypatch.setenv("DUALPATH_API_KEYS", "k1,k2")
    assert _api_key() == "k1"


def test_the_key_may_come_from_the_settings_file(monkeypatch, tmp_path):
    monkeypatch.delenv("DUALPATH_API_KEYS", raising=False)
    (tmp_path / "d.toml").write_text('[scheduler]\napi_keys = ["from-file"]\n')
    monkeypatch.setenv("DUALPATH_CONFIG", str(tmp_path / "d.toml"))
    assert _api_key() == "from-file"
