"""Log-probabilities in the answer: which tokens a chunk reports, and their JSON shapes.

Owns how the per-token log-probabilities that engines send (`TokenEvent.logprobs`)
follow the text through detokenization and stop matching, and how they are written
for `/v1/completions` and `/v1/chat/completions`. No I/O.

How logprobs follow the text. Tokens become text in *pieces*: a token that completes
no character (half of a UTF-8 character, a skipped special token) adds "" and joins
the next token that does; a piece is those tokens and the text they produced, at
[start, end) of the completion text. A chunk reports the tokens of every piece whose
text the client has now received in full, so a token is reported once, in the chunk
that carries the end of its text (or in the last chunk). Text the stop matcher holds
back holds its tokens back with it. At a stop sequence the text is cut at the match:
the tokens of the pieces that start before the cut are reported (a piece the cut runs
through counts), the tokens that only spell the stop sequence (or come after it) are
not. So every reported token has some of its text in the returned text, and
`text_offset` (the start of the token's piece, in characters of the completion text,
counted across the whole stream) always points into it.

Shapes (values are the model's raw distribution, before temperature and top_p):
- completions: {"tokens": [str], "token_logprobs": [float], "top_logprobs": [{str: float}],
  "text_offset": [int]}; each top_logprobs dict holds the N most likely tokens (N =
  the request's `logprobs`), so with logprobs=0 every dict is empty. Two ids with the
  same text share one key (the more likely one's value).
- chat: {"content": [{"token", "logprob", "bytes", "top_logprobs": [{"token",
  "logprob", "bytes"}]}]}, with top_logprobs=N entries (none when 0 or absent).
A token alone that is not valid UTF-8 is shown as `bytes:\\x..` (token_text.py).
"""
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
        """The decoder's held-back rest; closes the last piece (possibly empty: e.g. an end-of-sequence id)."""
        tail = decoder.finish()
        if self.open or tail:
            self._close(len(tail))
        return tail

    def release(self, emitted: int, stopped: bool = False) -> list[Reported]:
        """Tokens to report now that the client has `emitted` characters; `stopped`: the text was cut
        at a stop sequence there (nothing after it will ever be reported)."""
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
