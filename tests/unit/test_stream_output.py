"""The output subject's two messages: a TokenEvent (array) and a decode step's StepEvents (map)
decode through the one `Output` decoder, each as itself."""
from __future__ import annotations

import msgspec
import pytest

from shared.messages import stream
from shared.messages.stream import StepEvents, TokenEvent, TokenLogprob

pytestmark = pytest.mark.unit


def test_step_events_round_trip_as_step_events_with_every_entry():
    step = StepEvents([TokenEvent("a#0", [5], 3), TokenEvent("b#1", [7], 9, finish="length"),
                       TokenEvent("c#0", [2], 1, logprobs=[TokenLogprob(-0.5, [2, 4], [-0.5, -1.5])])], "de-0")
    got = stream.decoder.decode(stream.encoder.encode(step))
    assert isinstance(got, StepEvents)
    assert got == step


def test_a_token_event_still_decodes_as_a_token_event_on_the_output_subject():
    ev = TokenEvent("r#0", [1], 0, source="pe-0", cached_tokens=64)
    got = stream.decoder.decode(stream.encoder.encode(ev))
    assert type(got) is TokenEvent and got == ev


def test_step_events_is_a_map_and_its_entries_arrays():
    raw = msgspec.msgpack.decode(stream.encoder.encode(StepEvents([TokenEvent("a", [5], 3)], "de-0")))
    assert set(raw) == {"events", "source"} and raw["source"] == "de-0"
    assert raw["events"][0][:3] == ["a", [5], 3]


@pytest.mark.parametrize("bad", [{"events": "nope"}, {"events": [["a", "not-a-list"]]}, {"source": "x"}, 7])
def test_malformed_step_events_are_rejected(bad):
    with pytest.raises(msgspec.ValidationError):
        stream.decoder.decode(msgspec.msgpack.encode(bad))
