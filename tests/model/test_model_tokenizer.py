"""Tokenizer runtime: round trips, streaming deltas, chat templates, no torch import."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from shared.model.tokenizer import ChatTemplateError, IncrementalDecoder
from shared.model.tokenizer_build import byte_alphabet, load_tokenizer, tiny_tokenizer

pytestmark = pytest.mark.unit
ROOT = Path(__file__).resolve().parents[2]
TEXT = "naïve café — 日本語 🙂 <|im_end|> tail"


def test_byte_alphabet_is_a_bijection_of_printable_chars():
    a = byte_alphabet()
    assert len(set(a)) == 256 and a[ord("A")] == "A" and a[ord(" ")] == "Ġ" and a[ord("\n")] == "Ċ"


def test_tiny_round_trip_and_special_tokens():
    tok = tiny_tokenizer()
    ids = tok.encode(TEXT)
    assert 258 in ids and tok.vocab_size == 259
    assert tok.decode(ids, skip_special_tokens=False) == TEXT
    assert tok.decode(ids) == TEXT.replace("<|im_end|>", "")
    assert tok.encode("é") == [0xC3, 0xA9]


def test_incremental_decoder_emits_exact_text_and_never_half_a_character():
    tok = tiny_tokenizer()
    dec = IncrementalDecoder(tok, skip_special_tokens=False)
    deltas = [dec.push(i) for i in tok.encode(TEXT)]
    assert "".join(deltas) + dec.finish() == TEXT
    assert not any("\ufffd" in d for d in deltas)
    assert deltas[:3] == ["n", "a", ""]  # "ï" is two bytes: nothing until the second
    assert deltas[3] == "ï"


def test_incremental_decoder_flushes_an_incomplete_character_at_finish():
    tok = tiny_tokenizer()
    dec = IncrementalDecoder(tok)
    assert dec.push(ord("a")) == "a"
    assert dec.push(0xE6) == ""  # first byte of a 3-byte character
    assert dec.finish() == "\ufffd"


def test_chat_template_renders_chatml_and_refuses_without_template():
    tok = tiny_tokenizer()
    msgs = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    assert tok.apply_chat_template(msgs) == (
        "<|im_start|>system\nbe brief<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    )
    assert tok.apply_chat_template(msgs, add_generation_prompt=False).endswith("hi<|im_end|>\n")
    tok.chat_template = None
    with pytest.raises(ChatTemplateError):
        tok.apply_chat_template(msgs)


def test_chat_template_is_sandboxed():
    tok = tiny_tokenizer()
    tok.chat_template = "{{ messages.__class__.__mro__[1].__subclasses__() }}"
    with pytest.raises(ChatTemplateError):
        tok.apply_chat_template([])


def test_load_tokenizer_never_imports_torch():
    code = (
        "import sys; from shared.model.tokenizer_build import load_tokenizer; t = load_tokenizer('tiny'); "
        "assert t.encode('hi') == [104, 105]; assert 'torch' not in sys.modules, 'torch imported'"
    )
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True, capture_output=True)
    assert load_tokenizer('random:{"n_layers": 1}').vocab_size == 259
