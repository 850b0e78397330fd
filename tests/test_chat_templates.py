"""Chat templates render as `transformers`' `apply_chat_template` renders them, text and ids.

For each family's template (tests/_chat_templates.py) and tiny tokenizer
(tests/_hf_tokenizers.py): every conversation, with and without tools, with and without
the generation prompt, equals `apply_chat_template(..., tokenize=False)` and its ids equal
`apply_chat_template(..., tokenize=True)`; random message text too (hypothesis).
"""

from __future__ import annotations

import jinja2
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from transformers import AutoTokenizer
from transformers.utils.chat_template_utils import _normalize_chat_messages, render_jinja_template

from core.policy.text import chat_template
from core.policy.text.tokenizer import load_tokenizer
from tests import _chat_templates as chats
from tests import _hf_tokenizers as tiny

FAMILIES = ("qwen2", "qwen3", "llama3", "gemma3")


@pytest.fixture(scope="module")
def family(tmp_path_factory):
    """family -> (ours, transformers' AutoTokenizer), on a checkpoint with the template in
    tokenizer_config.json for half of them and in chat_template.jinja for the others."""
    root = tmp_path_factory.mktemp("templates")
    out = {}
    for n, name in enumerate(FAMILIES):
        path = tiny.write(root / name, name, layout=("config", "jinja")[n % 2])
        out[name] = (load_tokenizer(path), AutoTokenizer.from_pretrained(str(path), local_files_only=True))
    return out


def _assert_same(ours, auto, conversation, **kw):
    text = ours.render_chat(conversation, **kw)
    assert text == auto.apply_chat_template(conversation, tokenize=False, **kw)
    ids = auto.apply_chat_template(conversation, tokenize=True, return_dict=False, **kw)
    assert ours.encode_chat(conversation, **kw) == ids
    assert ours.encode(text) == ids


@pytest.mark.parametrize("name", FAMILIES)
@pytest.mark.parametrize("tools", [None, chats.TOOLS], ids=["no-tools", "tools"])
@pytest.mark.parametrize("add_generation_prompt", [False, True])
def test_render_and_ids_equal_apply_chat_template(family, name, tools, add_generation_prompt):
    ours, auto = family[name]
    conversations, _ = chats.FAMILY_CHATS[name]
    for conversation in conversations:
        _assert_same(ours, auto, conversation, tools=tools, add_generation_prompt=add_generation_prompt)
    if name == "qwen3":  # a template switch passed as a variable
        for conversation in conversations:
            _assert_same(ours, auto, conversation, add_generation_prompt=add_generation_prompt, enable_thinking=False)
    if name == "llama3":  # a variable the template would otherwise fill with strftime_now
        _assert_same(ours, auto, conversations[0], tools=tools, date_string="26 Jul 2024")


@pytest.mark.parametrize("name", FAMILIES)
def test_tool_turns_render_the_family_format(family, name):
    """A tool call and its result appear in the family's own tool format."""
    ours, _ = family[name]
    if name == "gemma3":
        return  # no tool turns: refused below
    text = ours.render_chat(chats.tool_chat(), tools=chats.TOOLS, add_generation_prompt=True)
    if name.startswith("qwen"):
        assert '<tool_call>\n{"name": "calculate", "arguments": {"expression": "2+3*4"}}\n</tool_call>' in text
        assert "<|im_start|>user\n<tool_response>\n14\n</tool_response>\n<tool_response>\n" in text
        assert text.endswith("<|im_start|>assistant\n")
    else:
        assert '"name": "calculate"' in text and "Environment: ipython" in text
        assert "<|start_header_id|>ipython<|end_header_id|>\n\n14<|eot_id|>" in text
        assert text.endswith("<|start_header_id|>assistant<|end_header_id|>\n\n")


def test_refused_conversations_are_refused_as_hf_refuses(family):
    ours, auto = family["gemma3"]
    _, refused = chats.FAMILY_CHATS["gemma3"]
    for conversation in refused:
        with pytest.raises(jinja2.TemplateError) as hf_error:
            auto.apply_chat_template(conversation, tokenize=False)
        with pytest.raises(jinja2.TemplateError) as our_error:
            ours.render_chat(conversation)
        assert (
            str(our_error.value)
            == str(hf_error.value)
            == "Conversation roles must alternate user/assistant/user/assistant/..."
        )


CONTENT = st.lists(
    st.one_of(
        st.text(max_size=10),
        st.sampled_from([" ", "\n", "  \n", "<|im_end|>", "<|eot_id|>", "<end_of_turn>", "<tool_call>", "€", "'s"]),
    ),
    max_size=6,
).map("".join)


@pytest.mark.parametrize("name", FAMILIES)
@settings(deadline=None, max_examples=40, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_random_message_text_renders_as_hf(family, name, data):
    ours, auto = family[name]
    system = data.draw(st.none() | CONTENT)
    turns = data.draw(st.lists(CONTENT, min_size=1, max_size=4))
    conversation = chats.chat(system, *turns)
    kw = {"add_generation_prompt": data.draw(st.booleans()), "date_string": "1 Jan 2025"}
    if name != "gemma3":
        kw["tools"] = data.draw(st.none() | st.just(chats.TOOLS))
    _assert_same(ours, auto, conversation, **kw)


def test_named_templates_pick_tool_use_when_tools_are_given(tmp_path):
    """A config's list of templates: "tool_use" when tools are given, else "default"."""
    named = [{"name": "default", "template": chats.QWEN25}, {"name": "tool_use", "template": chats.QWEN3}]
    path = tiny.write(tmp_path / "named", "qwen3", template=named)
    ours = load_tokenizer(path)
    auto = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    assert dict(ours.chat_templates) == {"default": chats.QWEN25, "tool_use": chats.QWEN3} == auto.chat_template
    assert ours.chat_template == chats.QWEN25
    for tools in (None, chats.TOOLS):
        _assert_same(ours, auto, chats.tool_chat(), tools=tools, add_generation_prompt=True)
    assert ours.render_chat(chats.chat(None, "hi")).startswith("<|im_start|>system\nYou are a helpful assistant.")


# Environment features, against HF's own renderer (no tokenizer involved).
FEATURES = r"""
{%- set ns = namespace(count=0) %}
{%- for m in messages %}
    {%- if loop.index > 4 %}{% break %}{% endif %}
    {%- if m.role == 'skip' %}{% continue %}{% endif %}
    {%- set ns.count = ns.count + 1 %}
  {% generation %}{{ m.role }}: {{ m.content }}{% endgeneration %}
{%- endfor %}
{{ ns.count }}|{{ messages | tojson }}
{{ tools | tojson(indent=2) }}
{{ {"b": 1, "a": "<&>'ü"} | tojson(separators=(",", ":")) }} {{ "é" | tojson(ensure_ascii=True) }}
{{ dict(x=1, y=[1, 2]) | tojson }} {{ dict.fromkeys(["k"], 0) | tojson }}
{{ documents is none }} {{ add_generation_prompt }} {{ extra }} {{ bos_token is defined }}
{{ messages[0].keys() | list | tojson }} {{ messages[-1].reasoning_content }}
    {% if true %}
    indented, lstrip'd tags
    {% endif %}
{{ "%Y" | length }} {{ strftime_now("%Y") | length }}
"""


def test_environment_features_equal_hf():
    messages = [
        {"role": "system", "content": "s", "name": None},
        {"role": "skip", "content": "x"},
        {"role": "user", "content": "u <|im_end|> ü"},
        {"role": "assistant", "content": "a", "thinking": "hmm"},
        {"role": "user", "content": "late"},
    ]
    ours = chat_template.render(
        FEATURES, messages, tools=chats.TOOLS, add_generation_prompt=True, variables={"extra": 7}
    )
    rendered, _ = render_jinja_template(  # apply_chat_template normalizes, then renders
        conversations=[_normalize_chat_messages(messages)],
        tools=chats.TOOLS,
        chat_template=FEATURES,
        add_generation_prompt=True,
        extra=7,
    )
    assert ours == rendered[0]
    assert '"name": null' not in ours and '"reasoning_content": "hmm"' in ours  # None dropped, reasoning aliased


@pytest.mark.parametrize(
    "template",
    [
        "{{ messages.__class__.__mro__ }}",
        "{{ messages.append(1) }}",
        "{% set ns = namespace(_secret=1) %}",
        "{{ dict.__init__ }}{{ ''.__class__.__subclasses__() }}",
    ],
)
def test_the_sandbox_refuses_escapes(template):
    with pytest.raises(jinja2.exceptions.SecurityError):
        chat_template.render(template, [{"role": "user", "content": "hi"}])


def test_render_refusals():
    with pytest.raises(ValueError, match="empty conversation"):
        chat_template.render("x", [])
    with pytest.raises(TypeError, match="a tool must be a JSON-schema dict"):
        chat_template.render("x", [{"role": "user", "content": "hi"}], tools=[print])
    with pytest.raises(TypeError, match="a chat message must be a dict"):
        chat_template.render("x", ["hi"])
    with pytest.raises(ValueError, match=r"template variables \['messages'\] are set by render"):
        chat_template.render("x", [{"role": "user", "content": "hi"}], variables={"messages": []})
