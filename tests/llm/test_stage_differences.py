"""What a refusal of mrt run says changed: the dotted leaf keys that differ, each value short."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st


def _rec(settings_: dict) -> dict:
    from mrt_fast.llm.stage_records import make_record

    return make_record(settings_)


def test_a_nested_setting_is_named_by_its_dotted_key_not_its_whole_section():
    from mrt_fast.llm.stage_records import differences

    gen = {"n": 8, "max_new_tokens": 24, "temperature": 1.0, "top_p": 0.95, "seed": 0, "backend": "auto",
           "stop": ["\n\n", "###"], "system_prompt": "You are a helpful assistant. " * 10}
    old = _rec({"model": "m", "generate": gen})
    new = _rec({"model": "m", "generate": {**gen, "temperature": 0.5}})
    assert differences(old, new) == "generate.temperature 1.0 -> 0.5"
    files = {"spec": "models/lm", "files": {"model.safetensors": {"bytes": 10, "blake2b": "a" * 32}}}
    other = {"spec": "models/lm", "files": {"model.safetensors": {"bytes": 10, "blake2b": "b" * 32}}}
    assert differences(_rec({"model": files}), _rec({"model": other})) == "model: its files changed"
    assert differences(_rec({"kernel": "clip"}), _rec({"kernel": "shift"})) == "kernel 'clip' -> 'shift'"


@settings(max_examples=50, deadline=None)
@given(st.dictionaries(st.sampled_from("abcd"), st.one_of(st.integers(), st.text(max_size=200),
                                                          st.dictionaries(st.sampled_from("xyz"), st.integers()))),
       st.sampled_from("abcd"), st.integers())
def test_the_message_names_each_changed_leaf_once_and_stays_short(base, key, value):
    from mrt_fast.llm.stage_records import differences, leaves

    changed = {**base, key: value}
    msg = differences(_rec(base), _rec(changed))
    if leaves(base) == leaves(changed):
        assert msg == ""
        return
    assert len(msg) < 300 and '{"' not in msg  # no section spelled out
    differ = sorted(k for k in set(leaves(base)) | set(leaves(changed)) if leaves(base).get(k) != leaves(changed).get(k))
    assert all(k in msg for k in differ[:3])
