"""docs/concepts/request-lifecycle.md names every state machine's states and moves as the code has them,
and every message its sequence diagrams send exists."""
from __future__ import annotations

import importlib
import pkgutil
import re

import msgspec
import pytest

import shared.messages
from dualpath.lifecycle_doc import DOC, spliced

pytestmark = pytest.mark.unit


def test_the_generated_states_in_the_doc_are_current():
    text = DOC.read_text()
    assert spliced(text) == text, "docs/concepts/request-lifecycle.md is stale: python -m dualpath.lifecycle_doc --write"


def test_every_message_in_the_sequence_diagrams_is_a_message_type():
    types = {name for info in pkgutil.iter_modules(shared.messages.__path__)
             for name, v in vars(importlib.import_module(f"shared.messages.{info.name}")).items()
             if isinstance(v, type) and issubclass(v, msgspec.Struct)}
    diagrams = re.findall(r"```mermaid\n(.*?)```", DOC.read_text(), re.S)
    sent = {m for d in diagrams for m in re.findall(r"^\s*\w+-?-[>x]{1,2}\w+: ([A-Z]\w+)", d, re.M)}
    assert len(diagrams) >= 5 and len(sent) >= 15, (len(diagrams), sorted(sent))
    assert sent <= types, f"not a message type in shared/messages: {sorted(sent - types)}"


def test_the_kv_plan_section_names_every_source_and_only_message_types():
    from shared.messages.plan import Source
    section = DOC.read_text().split("## The KV plan", 1)[1].split("\n## ", 1)[0]
    assert [m.value for m in Source] == re.findall(r"^- `(\w+)`", section, re.M)  # each source, in order
    mods = [importlib.import_module(f"shared.messages.{m}") for m in ("plan", "work")]
    types = {name for mod in mods for name, v in vars(mod).items() if isinstance(v, type)}
    named = set(re.findall(r"`([A-Z][a-z]\w+)`", section))
    assert {"KvPlan", "KvRange", "Source", "DecodeAdmit"} <= named <= types, sorted(named - types)
