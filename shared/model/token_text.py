"""One token id on its own -> the text and raw bytes shown for it in log-probabilities. No torch.

A token alone need not be valid UTF-8: byte-level BPE splits a multi-byte character
over tokens (the tiny vocabulary is one byte per token). Such a token is shown as
`bytes:\\xe2\\x80` (OpenAI's spelling) and its raw bytes are recovered from the
vocabulary (the byte-level alphabet, or a `<0xNN>` byte-fallback piece). Special tokens
are shown by their text (e.g. `<|im_end|>`), although the completion text leaves them
out. Results are cached per id (the vocabulary bounds the cache).
"""

from __future__ import annotations

import re

from shared.model.tokenizer import Tokenizer
from shared.model.tokenizer_build import byte_alphabet

_BYTE_PIECE = re.compile(r"<0x([0-9A-Fa-f]{2})>")  # SentencePiece byte fallback
_BYTE_OF = {ch: b for b, ch in enumerate(byte_alphabet())}  # byte-level BPE: stand-in -> byte


class TokenText:
    """`text(id)` -> (display string, raw bytes) of one token, for one tokenizer."""

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
        """The token's bytes from its vocabulary piece, when the piece spells bytes."""
        piece = self.tok.inner.id_to_token(token)
        if not piece:
            return None
        if m := _BYTE_PIECE.fullmatch(piece):
            return bytes([int(m[1], 16)])
        if all(c in _BYTE_OF for c in piece):
            return bytes(_BYTE_OF[c] for c in piece)
        return None
