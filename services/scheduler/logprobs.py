"""Log-probabilities in the answer: which tokens a chunk reports, and their JSON shapes.

A token is reported once, in the chunk that carries the end of its text; tokens that only spell
a stop sequence are never reported, so `text_offset` always points into the returned text.
Values are the model's raw distribution. No I/O."""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from shared.messages.stream import TokenLogprob
from shared.model.token_text import TokenText
from shared.model.tokenizer import IncrementalDecoder

FLOOR = -9999.0  # JSON has no -inf; a log-probability below this is reported as this (as vLLM does)


@dataclass(frozen=True, slots=True)
class Reported:
    token: int
    lp: TokenLogprob
    offset: int  # start of the token's text in the completion text (characters)


class LogprobTrack:
    """Follows one request's tokens through the decoder and the stop matcher.

    Example (tiny byte vocabulary, text "é!" = bytes c3 a9 21): push c3 -> "" (piece open),
    push a9 -> "é" closes piece [0, 1) = (c3, a9), push 21 -> "!" closes [1, 2) = (21,).
    `release(1)` reports c3 and a9 at offset 0; `release(2)` then reports 21 at offset 1.
    """

    def __init__(self) -> None:
        self.open: list[tuple[int, TokenLogprob | None]] = []  # tokens of the piece still producing no text
        self.closed: deque[tuple[int, int, list[tuple[int, TokenLogprob | None]]]] = deque()  # (start, end, toks)
        self.end = 0  # characters decoded so far

    def push(self, decoder: IncrementalDecoder, tokens: list[int], logprobs: list[TokenLogprob]) -> str:
        """Decode `tokens` one by one (each with its logprob); the text they add."""
        lps = logprobs if len(logprobs) == len(tokens) else [None] * len(tokens)  # missing: not reported
        out = []
        for token, lp in zip(tokens, lps):
            self.open.append((token, lp))
            text = decoder.push(token)
            if text:
                self._close(len(text))
                out.append(text)
        return "".join(out)

    def finish(self, decoder: IncrementalDecoder) -> str:
        """The decoder's held-back rest; closes the last piece (maybe empty)."""
        tail = decoder.finish()
        if self.open or tail:
            self._close(len(tail))
        return tail

    def release(self, emitted: int, stopped: bool = False) -> list[Reported]:
        """Tokens to report now the client has `emitted` characters; `stopped`: cut at a stop there."""
        out: list[Reported] = []
        while self.closed and (self.closed[0][1] <= emitted or (stopped and self.closed[0][0] < emitted)):
            start, _, toks = self.closed.popleft()
            out += [Reported(t, lp, start) for t, lp in toks if lp is not None]
        if stopped:
            self.closed.clear()
            self.open = []
        return out

    def _close(self, n: int) -> None:
        self.closed.append((self.end, self.end + n, self.open))
        self.open = []
        self.end += n


def _value(lp: float) -> float:
    return lp if lp > FLOOR else FLOOR  # also maps NaN to the floor


def completion_logprobs(items: list[Reported], text: TokenText) -> dict:
    """The `choices[].logprobs` object of /v1/completions for these tokens."""
    tops = []
    for it in items:
        top: dict[str, float] = {}
        for tid, v in zip(it.lp.top_ids, it.lp.top_logprobs):
            top.setdefault(text(tid)[0], _value(v))  # most likely first: a shared key keeps the higher
        tops.append(top)
    return {"tokens": [text(it.token)[0] for it in items], "token_logprobs": [_value(it.lp.logprob) for it in items],
            "top_logprobs": tops, "text_offset": [it.offset for it in items]}


def _chat_entry(token: int, lp: float, text: TokenText) -> dict:
    s, raw = text(token)
    return {"token": s, "logprob": _value(lp), "bytes": list(raw)}


def chat_logprobs(items: list[Reported], text: TokenText) -> dict:
    """The `choices[].logprobs` object of /v1/chat/completions for these tokens."""
    return {"content": [
        {**_chat_entry(it.token, it.lp.logprob, text),
         "top_logprobs": [_chat_entry(t, v, text) for t, v in zip(it.lp.top_ids, it.lp.top_logprobs)]}
        for it in items]}


def logprobs_body(items: list[Reported], text: TokenText, chat: bool) -> dict:
    return chat_logprobs(items, text) if chat else completion_logprobs(items, text)
