"""The text and raw bytes shown for one token id in log-probabilities. No torch.

A token that is not valid UTF-8 alone is shown as `bytes:\\xe2\\x80` (OpenAI's spelling).
"""

from __future__ import annotations

import re

from shared.model.tokenizer import Tokenizer
from shared.model.tokenizer_build import byte_alphabet

_BYTE_PIECE = re.compile(r"<0x([0-9A-Fa-f]{2})>")  # SentencePiece byte fallback
_BYTE_OF = {ch: b for b, ch in enumerate(byte_alphabet())}  # byte-level BPE: stand-in -> byte


class TokenText:
    """Called with a token id: (display string, raw bytes), cached per id."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tok = tokenizer
        self._cache: dict[int, tuple[str, bytes]] = {}

    def __call__(self, token: int) -> tuple[str, bytes]:
        hit = self._cache.get(token)
        if hit is None:
            hit = self._cache[token] = self._render(token)
        return hit

    def _render(self, token: int) -> tuple[str, bytes]:
        text = self.tok.decode([token], skip_special_tokens=False)
        if "\ufffd" not in text:
            return text, text.encode()
        raw = self._raw(token)
        if raw is None:
            return text, text.encode()
        try:
            return raw.decode("utf-8"), raw  # a token that really is U+FFFD
        except UnicodeDecodeError:
            return "bytes:" + "".join(f"\\x{b:02x}" for b in raw), raw

    def _raw(self, token: int) -> bytes | None:
        piece = self.tok.inner.id_to_token(token)
        if not piece:
            return None
        if m := _BYTE_PIECE.fullmatch(piece):
            return bytes([int(m[1], 16)])
        if all(c in _BYTE_OF for c in piece):
            return bytes(_BYTE_OF[c] for c in piece)
        return None
