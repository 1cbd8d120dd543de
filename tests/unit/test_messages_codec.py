"""Control-plane messages: msgpack round-trips, the tagged Announce union, schema evolution."""
from __future__ import annotations

import dataclasses
import enum
import importlib
import inspect
import pkgutil
import types
import typing

import msgspec
import pytest

import shared.messages as messages_pkg
from shared.messages import registry, stream, traffic_manager
from shared.messages.codes import ErrorCode, FinishReason, LoadMode
from shared.messages.endpoints import EP
from shared.messages.registry import Announce, EngineAnnounce, StorageGatewayAnnounce, SchedulerAnnounce, \
    TrafficManagerAnnounce
from shared.messages.stream import PromptTiers, TokenEvent
from shared.messages.subjects import Subjects
from shared.messages.work import Sampling

pytestmark = pytest.mark.unit

MODULES = [importlib.import_module(f"shared.messages.{m.name}") for m in pkgutil.iter_modules(messages_pkg.__path__)]
STRUCTS = sorted({cls for mod in MODULES for _, cls in inspect.getmembers(mod, inspect.isclass)
                  if issubclass(cls, msgspec.Struct) and cls.__module__ == mod.__name__},
                 key=lambda c: (c.__module__, c.__name__))
UNION_MEMBERS = typing.get_args(Announce)


def sample(tp, name: str):
    """A value of type `tp` that differs from any field default (so omit_defaults cannot hide it)."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        return sample(next(a for a in typing.get_args(tp) if a is not type(None)), name)
    if origin is list:
        (elem,) = typing.get_args(tp)
        return [sample(elem, name), sample(elem, name + "2")]
    if isinstance(tp, type) and issubclass(tp, msgspec.Struct):
        return build(tp)
    if dataclasses.is_dataclass(tp):  # a dataclass a Struct carries (front.Hint)
        hints = typing.get_type_hints(tp)
        return tp(**{f.name: sample(hints[f.name], f.name) for f in dataclasses.fields(tp)})
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return list(tp)[-1]  # the defaults are the first member (or None)
    if tp is bool:
        return True
    if tp is int:
        return 7 + len(name)
    if tp is float:
        return 1.5 + len(name)
    if tp is str:
        return f"v-{name}"
    if tp is bytes:
        return b"\x00\x01" + name.encode()
    raise AssertionError(f"no sample for {tp!r} ({name}); extend sample()")


def build(cls):
    hints = typing.get_type_hints(cls)
    fields = msgspec.structs.fields(cls)
    values = {}
    for f in fields:
        tp = hints[f.name]
        values[f.name] = (not f.default) if tp is bool and not f.required else sample(tp, f.name)
    return cls(**values)


@pytest.mark.parametrize("cls", STRUCTS, ids=lambda c: f"{c.__module__.rsplit('.', 1)[-1]}.{c.__name__}")
def test_every_struct_round_trips_through_msgpack_with_every_field_set(cls):
    msg = build(cls)
    assert msgspec.msgpack.decode(msgspec.msgpack.encode(msg), type=cls) == msg


@pytest.mark.parametrize("cls", STRUCTS, ids=lambda c: f"{c.__module__.rsplit('.', 1)[-1]}.{c.__name__}")
def test_every_struct_round_trips_with_only_required_fields(cls):
    hints = typing.get_type_hints(cls)
    required = {f.name: sample(hints[f.name], f.name) for f in msgspec.structs.fields(cls) if f.required}
    msg = cls(**required)
    assert msgspec.msgpack.decode(msgspec.msgpack.encode(msg), type=cls) == msg


def test_message_families_are_all_found():
    found = {c.__module__.rsplit(".", 1)[-1] for c in STRUCTS}
    assert {"registry", "stream", "traffic_manager", "work"} <= found
    assert len(STRUCTS) >= 15


def test_a_block_key_field_has_one_name_at_every_hop():
    """A list of block keys is `block_keys` (`adopt_block_keys`: the staged prefix to adopt), one key
    `block_key`: never `keys`/`key`, whichever message carries it."""
    lists = {f"{c.__name__}.{n}" for c in STRUCTS for n, tp in typing.get_type_hints(c).items() if tp == list[bytes]}
    assert lists and all(name.endswith("block_keys") for name in lists), lists
    named = {f"{c.__name__}.{n}" for c in STRUCTS for n in typing.get_type_hints(c) if n in ("keys", "key")}
    assert not named, named


@pytest.mark.parametrize("cls", UNION_MEMBERS, ids=lambda c: c.__name__)
def test_announce_union_decodes_each_member_by_its_tag(cls):
    msg = build(cls)
    got = registry.decoder.decode(msgspec.msgpack.encode(msg))
    assert type(got) is cls and got == msg


def test_announce_tags_are_distinct_and_named():
    tags = {c.__struct_config__.tag for c in UNION_MEMBERS}
    assert tags == {"engine", "traffic_manager", "storage_gateway", "scheduler"}


def test_announce_wire_form_is_a_map_tagged_by_kind():
    raw = msgspec.msgpack.decode(msgspec.msgpack.encode(StorageGatewayAnnounce("g1", "n1", read_q_blocks=3)))
    assert raw == {"kind": "storage_gateway", "instance": "g1", "node": "n1", "read_q_blocks": 3}


def test_announce_omits_defaults_on_the_wire():
    raw = msgspec.msgpack.decode(msgspec.msgpack.encode(EngineAnnounce("i", "n")))
    assert raw == {"kind": "engine", "instance": "i", "node": "n"}


def test_leaving_flag_survives_the_union_decoder():
    msg = TrafficManagerAnnounce("t", "n", engine="pe0", leaving=True)
    got = registry.decoder.decode(msgspec.msgpack.encode(msg))
    assert isinstance(got, TrafficManagerAnnounce) and got.leaving is True


def test_unknown_announce_kind_is_a_validation_error():
    with pytest.raises(msgspec.ValidationError):
        registry.decoder.decode(msgspec.msgpack.encode({"kind": "martian", "instance": "i", "node": "n"}))


def test_announce_missing_required_field_is_a_validation_error():
    with pytest.raises(msgspec.ValidationError):
        registry.decoder.decode(msgspec.msgpack.encode({"kind": "engine", "instance": "i"}))


# --- schema evolution ----------------------------------------------------------------------------

def test_older_decoder_reads_newer_announce_with_an_extra_field():
    class EngineAnnounceV2(registry.Base, tag="engine"):  # a future version, one more field
        engine: str = ""
        role: str = "prefill"
        gpu_util: float = 0.0
        extras: dict[str, int] = {}

    newer = EngineAnnounceV2("i", "n", engine="pe7", role="decode", gpu_util=0.75, extras={"a": 1})
    got = registry.decoder.decode(msgspec.msgpack.encode(newer))
    assert isinstance(got, EngineAnnounce)
    assert (got.instance, got.node, got.engine, got.role) == ("i", "n", "pe7", "decode")


@pytest.mark.parametrize("cls", STRUCTS, ids=lambda c: f"{c.__module__.rsplit('.', 1)[-1]}.{c.__name__}")
def test_every_struct_tolerates_an_unknown_extra_field(cls):
    msg = build(cls)
    wire = msgspec.msgpack.decode(msgspec.msgpack.encode(msg))
    if isinstance(wire, dict):
        wire["zz_future_field"] = [1, {"nested": True}]
    else:  # array_like: new fields are appended at the end
        wire.append({"future": 1})
    assert msgspec.msgpack.decode(msgspec.msgpack.encode(wire), type=cls) == msg


def test_newer_decoder_fills_defaults_for_fields_an_older_sender_lacks():
    old = {"kind": "traffic_manager", "instance": "t", "node": "n", "engine": "pe0"}  # no buffer/ready fields
    got = registry.decoder.decode(msgspec.msgpack.encode(old))
    assert (got.ready, got.buffer_bytes, got.endpoint) == (False, 0, b"")


def test_token_event_is_array_like_in_field_order():
    raw = msgspec.msgpack.decode(stream.encoder.encode(TokenEvent("r", [1, 2], 5, source="pe0")))
    assert raw[:3] == ["r", [1, 2], 5] and raw[5] == "pe0"
    full = TokenEvent("r", [1], 3, "stop", "", "de0", 64)
    assert stream.decoder.decode(stream.encoder.encode(full)) == full


def test_token_event_from_an_older_sender_with_fewer_trailing_fields():
    got = stream.decoder.decode(msgspec.msgpack.encode(["r", [9], 4, "length"]))
    assert got == TokenEvent("r", [9], 4, FinishReason.LENGTH)
    assert (got.source, got.cached_tokens, got.code, got.tiers) == ("", 0, None, None)


def test_token_event_tiers_travel_as_the_last_element_an_array_of_five_counts():
    ev = TokenEvent("r", [7], 0, source="pe0", cached_tokens=192,
                    tiers=PromptTiers(computed=10, buffer=64, storage_pe=64, storage_de=64))
    raw = msgspec.msgpack.decode(stream.encoder.encode(ev))
    assert raw[-1] == [10, 0, 64, 64, 64]  # computed, engine, buffer, storage_pe, storage_de
    assert stream.decoder.decode(stream.encoder.encode(ev)) == ev
    # a sender before error codes and tiers: both read as None
    got = stream.decoder.decode(msgspec.msgpack.encode(["r", [7], 0, None, "", "pe0", 192]))
    assert (got.code, got.tiers) == (None, None)


def test_token_event_from_a_sender_before_error_codes_reads_code_none():
    # every field such a sender knew, up to logprobs; `code` came after them all
    old = ["r", [], 3, "error", "engine died", "de0", 0, True, []]
    got = stream.decoder.decode(msgspec.msgpack.encode(old))
    assert (got.finish, got.error, got.retryable, got.code) == (FinishReason.ERROR, "engine died", True, None)


def test_token_event_code_follows_every_older_field_as_a_plain_string():
    ev = TokenEvent("r", [], 2, FinishReason.ERROR, "no engine took it", code=ErrorCode.NO_ENGINE)
    raw = msgspec.msgpack.decode(stream.encoder.encode(ev))
    assert raw[3] == "error" and raw[9] == "no_engine" and type(raw[9]) is str
    assert raw[10:] == [None]  # the tiers (newer than code): only a prefill engine's first token has them
    assert stream.decoder.decode(stream.encoder.encode(ev)) == ev


def test_a_running_token_event_carries_no_finish_string():
    # the running state is None on the wire, not "": an empty string (the form before FinishReason) is refused
    raw = msgspec.msgpack.decode(stream.encoder.encode(TokenEvent("r", [1], 0, source="pe0")))
    assert raw[3] is None
    with pytest.raises(msgspec.ValidationError, match="Invalid enum value ''"):
        stream.decoder.decode(msgspec.msgpack.encode(["r", [1], 0, "", "", "pe0"]))


@pytest.mark.parametrize("member", [*LoadMode, *FinishReason, *ErrorCode], ids=lambda m: f"{type(m).__name__}.{m.name}")
def test_every_enum_member_travels_as_its_string_and_comes_back_as_the_member(member):
    for codec in (msgspec.msgpack, msgspec.json):
        wire = codec.encode(member)
        assert codec.decode(wire) == member.value  # readable: the plain value, no wrapper
        assert codec.decode(wire, type=type(member)) is member


@pytest.mark.parametrize("tp", [LoadMode, FinishReason, ErrorCode])
def test_an_unknown_enum_value_is_a_validation_error(tp):
    with pytest.raises(msgspec.ValidationError, match="Invalid enum value 'martian'"):
        msgspec.msgpack.decode(msgspec.msgpack.encode("martian"), type=tp)


def test_enum_values_are_distinct_lowercase_words():
    for tp in (LoadMode, FinishReason, ErrorCode):
        values = [m.value for m in tp]
        assert len(set(values)) == len(values) and all(v == v.lower() and " " not in v for v in values)


# --- fetch progress: one message type per meaning, one Decoder ---------------------------------------

PROGRESS = typing.get_args(traffic_manager.FetchProgress)


@pytest.mark.parametrize("cls", PROGRESS, ids=lambda c: c.__name__)
def test_fetch_progress_decoder_returns_each_member_by_its_tag(cls):
    msg = build(cls)
    got = traffic_manager.progress_decoder.decode(msgspec.msgpack.encode(msg))
    assert type(got) is cls and got == msg


def test_fetch_progress_is_an_array_tagged_by_its_first_element():
    raw = msgspec.msgpack.decode(msgspec.msgpack.encode(traffic_manager.LayersLoaded("r", 5)))
    assert raw == ["layers", "r", 5]
    tags = {c.__struct_config__.tag for c in PROGRESS}
    assert tags == {"queued", "read", "layers", "failed"}


def test_fetch_progress_in_the_old_sentinel_form_is_refused():
    old = ["r", 0, -2]  # LayerLoaded(req_id, blocks, layer=-2): "queued" as a sentinel integer
    with pytest.raises(msgspec.ValidationError):
        traffic_manager.progress_decoder.decode(msgspec.msgpack.encode(old))


def test_fetch_failed_needs_a_known_code():
    with pytest.raises(msgspec.ValidationError):
        traffic_manager.progress_decoder.decode(msgspec.msgpack.encode(["failed", "r", "oops", "why"]))


def test_block_keys_and_fingerprint_travel_as_raw_bytes():
    from shared.messages.storage_gateway import HitQuery, StoreLayout

    key, fp = bytes(range(16)), bytes(range(16, 32))
    q = HitQuery(StoreLayout(fp, "m", 2, 1, 4, "float32", 16), [key, key])
    raw = msgspec.msgpack.encode(q)
    assert key in raw and fp in raw and key.hex().encode() not in raw  # bin, not hex text
    assert msgspec.msgpack.decode(raw, type=HitQuery) == q


def test_token_event_wrong_type_is_rejected():
    with pytest.raises(msgspec.ValidationError):
        stream.decoder.decode(msgspec.msgpack.encode(["r", "not-a-list"]))


def test_sampling_defaults_are_greedy_sixteen_tokens():
    s = msgspec.msgpack.decode(msgspec.msgpack.encode({}), type=Sampling)
    assert (s.temperature, s.top_p, s.seed, s.max_tokens, s.ignore_eos, s.stop_token_ids) == \
        (0.0, 1.0, None, 16, False, [])


def test_sampling_seed_null_round_trips_as_none():
    s = msgspec.msgpack.decode(msgspec.msgpack.encode({"seed": None}), type=Sampling)
    assert s.seed is None


# --- subjects ---------------------------------------------------------------------------------------

def test_subjects_are_prefixed_by_namespace():
    s = Subjects("ns1")
    assert s.at(EP.HEARTBEAT) == "ns1.hb"
    assert s.at(EP.PE_WORK, engine="pe0") == "ns1.prefill_engine.pe0.work"
    assert s.at(EP.DE_ADMIT, engine="de0") == "ns1.decode_engine.de0.admit"
    assert s.at(EP.CANCEL) == "ns1.cancel"
    assert s.at(EP.SCHED_OUT, scheduler="sch1") == "ns1.scheduler.sch1.out"
    assert s.at(EP.TM_PUSH, engine="pe0") == "ns1.traffic_manager.pe0.push"
    assert s.at(EP.SG_READ, node="node1") == "ns1.storage_gateway.node1.read"
    assert s.at(EP.SG_HIT) == "ns1.storage_gateway.any.hit"


def test_default_namespace_is_dp():
    assert Subjects().at(EP.HEARTBEAT) == "dp.hb"
