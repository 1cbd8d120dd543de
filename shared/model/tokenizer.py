"""Tokenizer: text <-> ids, streaming detokenization, and chat templates. No torch."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime
from functools import cached_property

import jinja2
import tokenizers
from jinja2.sandbox import ImmutableSandboxedEnvironment


class ChatTemplateError(ValueError):
    """The model has no chat template, or its template raised."""


@dataclass
class Tokenizer:
    inner: tokenizers.Tokenizer  # the HF `tokenizers` object doing the work
    eos_ids: tuple[int, ...]  # any of these ends generation
    bos_id: int | None = None  # beginning-of-sequence id, if any
    chat_template: str | None = None  # Jinja source, from the model's metadata
    special_tokens: dict[str, str] = field(default_factory=dict)  # bos_token / eos_token for templates

    @property
    def vocab_size(self) -> int:
        return self.inner.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str) -> list[int]:
        """Ids of `text`; special tokens written in it map to their ids; no BOS is added."""
        return self.inner.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self.inner.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def token_to_id(self, token: str) -> int | None:
        return self.inner.token_to_id(token)

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True) -> str:
        if self.chat_template is None:
            raise ChatTemplateError("this model has no chat template")
        try:
            return self._template.render(
                messages=messages, add_generation_prompt=add_generation_prompt, **self.special_tokens
            )
        except jinja2.TemplateError as e:
            raise ChatTemplateError(f"chat template failed: {e}") from e

    @cached_property
    def _template(self) -> jinja2.Template:
        env = ImmutableSandboxedEnvironment(
            trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
        )
        env.filters["tojson"] = lambda v, indent=None: json.dumps(v, ensure_ascii=False, indent=indent)
        env.globals["raise_exception"] = _raise_template_error
        env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
        return env.from_string(self.chat_template)


def _raise_template_error(message: str) -> None:
    raise jinja2.TemplateError(message)


class IncrementalDecoder:
    """Text deltas of a stream of ids, holding back a partial UTF-8 character (U+FFFD)."""

    def __init__(self, tokenizer: Tokenizer, skip_special_tokens: bool = True) -> None:
        self.tok = tokenizer
        self.skip = skip_special_tokens
        self.ids: list[int] = []
        self.prefix = 0  # start of the re-decoded context window
        self.read = 0  # end of what has been emitted

    def push(self, ids: int | list[int]) -> str:
        self.ids.extend([ids] if isinstance(ids, int) else ids)
        before = self.tok.decode(self.ids[self.prefix : self.read], self.skip)
        now = self.tok.decode(self.ids[self.prefix :], self.skip)
        if len(now) <= len(before) or now.endswith("\ufffd"):
            return ""
        self.prefix, self.read = self.read, len(self.ids)
        return now[len(before) :]

    def finish(self) -> str:
        """Whatever is still held back (an incomplete character comes out as U+FFFD)."""
        before = self.tok.decode(self.ids[self.prefix : self.read], self.skip)
        now = self.tok.decode(self.ids[self.prefix :], self.skip)
        self.prefix = self.read = len(self.ids)
        return now[len(before) :]
