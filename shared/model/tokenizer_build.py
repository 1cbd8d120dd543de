"""Building a Tokenizer from a model's files: tiny byte vocabulary, GGUF metadata, HF dir. No torch."""

from __future__ import annotations

import json
from pathlib import Path

import gguf
from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers
from tokenizers import Tokenizer as HFTokenizer

from shared.model.specs import resolve_spec
from shared.model.tokenizer import Tokenizer

TINY_SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")  # ids 256, 257, 258
TINY_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
END_TOKENS = ("<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<|end_of_text|>", "</s>")

# Split patterns of the common byte-level BPE pre-tokenizers (by tokenizer.ggml.pre).
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = _LLAMA3_SPLIT.replace(r"\p{N}{1,3}", r"\p{N}")


class UnsupportedTokenizer(ValueError):
    def __init__(self, path: str, model: str) -> None:
        super().__init__(f"{path}: tokenizer model {model!r} not supported (only gpt2 byte-level BPE)")
        self.path, self.model = path, model


def byte_alphabet() -> list[str]:
    """The 256 printable stand-ins of byte-level BPE: byte b -> alphabet[b]."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    out, shifted = {}, 0
    for b in range(256):
        if b in keep:
            out[b] = chr(b)
        else:
            out[b] = chr(256 + shifted)
            shifted += 1
    return [out[b] for b in range(256)]


def _byte_level(inner: HFTokenizer, pre: pre_tokenizers.PreTokenizer) -> HFTokenizer:
    inner.pre_tokenizer = pre
    inner.decoder = decoders.ByteLevel()
    return inner


def tiny_tokenizer() -> Tokenizer:
    """Bytes are ids 0..255, then <|endoftext|>, <|im_start|>, <|im_end|>; no merges."""
    vocab = {ch: b for b, ch in enumerate(byte_alphabet())}
    inner = _byte_level(HFTokenizer(models.BPE(vocab=vocab, merges=[])), pre_tokenizers.ByteLevel(add_prefix_space=False))
    inner.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in TINY_SPECIALS])
    return Tokenizer(
        inner=inner,
        eos_ids=(256, 258),
        bos_id=256,
        chat_template=TINY_TEMPLATE,
        special_tokens={"bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>"},
    )


def _gguf_pre_tokenizer(pre: str) -> pre_tokenizers.PreTokenizer:
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    if pre in ("llama-bpe", "llama3", "smaug-bpe"):
        return pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(_LLAMA3_SPLIT), "isolated"), byte_level])
    if pre == "qwen2":
        return pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(_QWEN2_SPLIT), "isolated"), byte_level])
    gpt2 = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if pre in ("smollm", "starcoder", "refact"):
        return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), gpt2])
    return gpt2


def _field(reader: gguf.GGUFReader, key: str, default=None):
    f = reader.fields.get(key)
    return default if f is None else f.contents()


def gguf_tokenizer(path: str, reader: gguf.GGUFReader | None = None) -> Tokenizer:
    r = reader if reader is not None else gguf.GGUFReader(path)
    model = _field(r, "tokenizer.ggml.model")
    if model != "gpt2":
        raise UnsupportedTokenizer(path, str(model))
    tokens: list[str] = _field(r, "tokenizer.ggml.tokens")
    types: list[int] = _field(r, "tokenizer.ggml.token_type", [1] * len(tokens))
    merges = [tuple(m.split(" ", 1)) for m in _field(r, "tokenizer.ggml.merges", [])]
    bpe = models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges, ignore_merges=False)
    inner = _byte_level(HFTokenizer(bpe), _gguf_pre_tokenizer(_field(r, "tokenizer.ggml.pre", "gpt2")))
    specials = [AddedToken(t, special=True, normalized=False) for t, ty in zip(tokens, types) if ty in (3, 4)]
    inner.add_special_tokens(specials)
    bos = _field(r, "tokenizer.ggml.bos_token_id")
    eos = _field(r, "tokenizer.ggml.eos_token_id")
    return Tokenizer(
        inner=inner,
        eos_ids=_eos_ids(tokens, types, [eos, _field(r, "tokenizer.ggml.eot_token_id")]),
        bos_id=bos,
        chat_template=_field(r, "tokenizer.chat_template"),
        special_tokens=_names(tokens, bos=bos, eos=eos),
    )


def _eos_ids(tokens: list[str], types: list[int], declared: list[int | None]) -> tuple[int, ...]:
    ids = {i for i in declared if i is not None}
    ids |= {i for i, (t, ty) in enumerate(zip(tokens, types)) if t in END_TOKENS and ty == 3}
    return tuple(sorted(ids))


def _names(tokens: list[str], *, bos: int | None, eos: int | None) -> dict[str, str]:
    out = {}
    if bos is not None:
        out["bos_token"] = tokens[bos]
    if eos is not None:
        out["eos_token"] = tokens[eos]
    return out


def _read_json(path: Path) -> dict:
    return json.loads(path.read_text()) if path.is_file() else {}


def _token_text(value) -> str | None:
    return value.get("content") if isinstance(value, dict) else value


def _as_list(value) -> list[int]:
    if value is None:
        return []
    return list(value) if isinstance(value, list) else [value]


def _hf_template(tc: dict) -> str | None:
    t = tc.get("chat_template")
    if isinstance(t, list):  # [{"name": "default", "template": ...}, ...]
        named = {e.get("name"): e.get("template") for e in t}
        return named.get("default") or next(iter(named.values()), None)
    return t


def hf_tokenizer(directory: str) -> Tokenizer:
    d = Path(directory)
    inner = HFTokenizer.from_file(str(d / "tokenizer.json"))
    tc = _read_json(d / "tokenizer_config.json")
    cfg, gen = _read_json(d / "config.json"), _read_json(d / "generation_config.json")
    names = {k: _token_text(tc.get(k)) for k in ("bos_token", "eos_token")}
    names = {k: v for k, v in names.items() if v is not None}
    eos = set(_as_list(cfg.get("eos_token_id"))) | set(_as_list(gen.get("eos_token_id")))
    if "eos_token" in names and inner.token_to_id(names["eos_token"]) is not None:
        eos.add(inner.token_to_id(names["eos_token"]))
    bos = cfg.get("bos_token_id")
    if bos is None and "bos_token" in names:
        bos = inner.token_to_id(names["bos_token"])
    return Tokenizer(inner=inner, eos_ids=tuple(sorted(eos)), bos_id=bos, chat_template=_hf_template(tc), special_tokens=names)


def load_tokenizer(spec: str) -> Tokenizer:
    kind, arg = resolve_spec(spec)
    if kind in ("tiny", "tiny-mla", "random"):
        return tiny_tokenizer()
    if kind == "gguf":
        return gguf_tokenizer(arg)
    return hf_tokenizer(arg)
