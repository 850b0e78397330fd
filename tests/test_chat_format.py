"""Chat formats (core/policy/text/chat_format.py): the byte format as before, and each family's
native format on its real chat template (tests/_chat_templates.py, tiny tokenizers).

Incremental ids (prompt, then each action and observation as an episode appends them)
against the whole conversation rendered at once:
  - qwen2, llama3: the same text and the same ids. A conversation that ends with a final
    answer renders what the template writes after its end-of-turn token ("\\n" for Qwen),
    which an episode (ended on that token) never holds.
  - qwen3: an episode's assistant turns open with the empty `<think>\\n\\n</think>\\n\\n`
    the template writes for the last assistant turn; a whole rendering drops it from each
    assistant turn a tool result follows (`NativeFormat.rewrites`). Elsewhere the same.
  - gemma3 (hermes): the same text; the ids differ where a model turn starts, because the
    tiny tokenizer's BPE merges across the "\\n" ending the generation prompt
    ("model\\n<" is one token in a whole rendering). Encoding the whole rendering cut at
    each model turn's start gives the episode's ids.
"""

from __future__ import annotations

import asyncio
import json
import unicodedata

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import environments
from core.policy.text.chat_format import ByteFormat, NativeFormat, chat_format_for
from core.policy.text.tokenizer import BOS, BYTE_TOKENIZER, EOS, load_tokenizer
from environments import sandbox
from environments.base import Environment
from environments.calculator import CalculatorEnv
from environments.tool_calls import (
    TURN_STOP_STRINGS,
    FinalAnswer,
    Malformed,
    ToolCall,
    format_error,
    format_result,
    parse_action,
)
from tests import _hf_tokenizers as tiny

FAMILIES = ("qwen2", "qwen3", "llama3", "gemma3")
STYLES = {"qwen2": "qwen", "qwen3": "qwen", "llama3": "llama3", "gemma3": "hermes"}
AFTER_EOT = {"qwen2": "\n", "qwen3": "\n", "llama3": "", "gemma3": "\n"}
EMPTY_THINK = "<think>\n\n</think>\n\n"
VARS = {"date_string": "26 Jul 2024"}  # Llama's template would otherwise read the clock
TOOLS = [t for name in ("calculator", "code", "guess") for t in environments.make(name).tools()]
CALC_TOOLS = environments.make("calculator").tools()
SLOW = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@pytest.fixture(scope="module")
def formats(tmp_path_factory):
    root = tmp_path_factory.mktemp("formats")
    return {f: chat_format_for(load_tokenizer(tiny.write(root / f, f)), template_vars=VARS) for f in FAMILIES}


def generated(fmt, text: str, end: bool = True) -> list[int]:
    """The ids of a model turn writing `text` (then its end-of-turn token)."""
    return fmt.tokenizer.encode(text) + ([fmt.tokenizer.eos_ids[0]] if end else [])


def _free_of_specials(fmt, *texts: str) -> bool:
    # A special token's text inside message text would be read as that token; "▁" is a
    # space to Gemma's decoder; "think>" is reasoning to Qwen3's template.
    bad = [*fmt.tokenizer.special_tokens, "▁", "think>"]
    return not any(b in t for t in texts for b in bad)


# -- construction --------------------------------------------------------------------------


def test_each_family_gets_its_style(formats):
    for family, fmt in formats.items():
        assert isinstance(fmt, NativeFormat) and fmt.native and fmt.name == STYLES[family]
        assert fmt.rewrites == (() if family != "qwen3" else (fmt.rewrites[0],))
    assert "drops '<think>\\n\\n</think>\\n\\n'" in formats["qwen3"].rewrites[0]


def test_byte_tokenizer_gets_the_byte_format():
    fmt = chat_format_for(BYTE_TOKENIZER)
    assert isinstance(fmt, ByteFormat) and not fmt.native and fmt.name == "byte"


def test_refusals(tmp_path):
    with pytest.raises(ValueError, match=f"{tmp_path / 'none'}.*no chat template"):
        chat_format_for(load_tokenizer(tiny.write(tmp_path / "none", "qwen2", template=None)))
    unknown = "{% for m in messages %}[{{ m.role }}]{{ m.content }}{% endfor %}{{ tools }}[TOOL_CALLS]"
    with pytest.raises(ValueError, match="none of qwen, llama3 or hermes"):
        chat_format_for(load_tokenizer(tiny.write(tmp_path / "unknown", "gemma3", template=unknown)))
    # A template that closes the last turn only when more follows is not append-only.
    rewriting = (
        "{{ bos_token }}{% for m in messages %}<start_of_turn>{{ m.role }}\n{{ m.content }}"
        "{% if not loop.last %}<end_of_turn>\n{% endif %}{% endfor %}"
        "{% if add_generation_prompt %}<end_of_turn>\n<start_of_turn>model\n{% endif %}"
    )
    with pytest.raises(ValueError, match="rewrites the prompt before it"):
        chat_format_for(load_tokenizer(tiny.write(tmp_path / "rewriting", "gemma3", template=rewriting)))


def test_observations_do_not_depend_on_the_date(formats):
    # Llama's template writes today's date in the system turn: a worker running past
    # midnight renders a longer or shorter history than its format was probed with.
    fmt = chat_format_for(formats["llama3"].tokenizer)  # the clock's date
    before = fmt.observation_ids("<result>3</result>")
    fmt.template_vars["date_string"] = "1 September 2031"
    assert fmt.observation_ids("<result>3</result>") == before
    assert "2031" in fmt.tokenizer.decode(fmt.prompt_ids("Hi", CALC_TOOLS))


# -- incremental ids against the whole conversation ----------------------------------------

# NFC: Qwen's tokenizer normalises, so only normalised text decodes back to itself.
texts = st.text(st.characters(blacklist_categories=("Cs",)), max_size=16).map(lambda t: unicodedata.normalize("NFC", t))
observations = st.one_of(texts, texts.map(format_result), texts.map(format_error))
episodes = st.tuples(
    texts,
    st.lists(st.tuples(texts, observations), max_size=3),
    st.one_of(st.none(), texts.map(str.strip)),
)


def _hf_messages(family, fmt, prompt, calls, answer):
    """The whole conversation as HF messages (the hermes ones come from the format: its
    system text and result wrapping are its own choice)."""
    messages = fmt.prompt_messages(prompt, CALC_TOOLS)
    for args, obs in calls:
        if family == "gemma3":
            messages += [fmt.assistant_message(f"<call calc>{args}</call>", CALC_TOOLS), fmt.observation_message(obs)]
        else:
            call = {"type": "function", "function": {"name": "calc", "arguments": {"expression": args}}}
            messages += [{"role": "assistant", "tool_calls": [call]}, {"role": "tool", "content": obs}]
    if answer is not None:
        messages.append({"role": "assistant", "content": answer})
    return messages


@pytest.mark.parametrize("family", FAMILIES)
@SLOW
@given(episode=episodes)
def test_incremental_ids_are_the_whole_conversation(formats, family, episode):
    fmt, (prompt, calls, answer) = formats[family], episode
    tok = fmt.tokenizer
    assume(_free_of_specials(fmt, prompt, answer or "", *(a + o for a, o in calls)))
    assume(all(parse_action(f"<call calc>{a}</call>") == ToolCall("calc", a) for a, _ in calls))
    assume(answer is None or parse_action(f"<answer>{answer}</answer>") == FinalAnswer(answer))
    pieces = [fmt.prompt_ids(prompt, CALC_TOOLS)]  # each piece: what the episode appends
    for args, obs in calls:
        pieces += [fmt.action_ids(f"<call calc>{args}</call>", CALC_TOOLS), fmt.observation_ids(obs)]
    if answer is not None:
        pieces.append(fmt.action_ids(f"<answer>{answer}</answer>", CALC_TOOLS))
    segments = [tok.decode(p, skip_special_tokens=False) for p in pieces]
    if family == "qwen3":  # the documented rewrite: historical tool-call turns lose the empty think
        for i in range(1, 2 * len(calls), 2):
            assert segments[i].startswith(EMPTY_THINK)
            segments[i] = segments[i][len(EMPTY_THINK) :]
    trailing = AFTER_EOT[family] if answer is not None else ""
    messages = _hf_messages(family, fmt, prompt, calls, answer)
    tools = None if family == "gemma3" else CALC_TOOLS
    whole = tok.render_chat(messages, tools, add_generation_prompt=answer is None, **VARS)
    assert "".join(segments) + trailing == whole
    if family != "qwen3":
        assert [tok.encode(s) for s in segments] == pieces
    if family != "gemma3":  # gemma: BPE merges across a model turn's start (test below)
        assert [i for s in [*segments, trailing] for i in tok.encode(s)] == tok.encode(whole)
    if family in ("qwen2", "llama3"):
        ids = [i for p in pieces for i in p] + tok.encode(trailing)
        assert ids == tok.encode_chat(messages, tools, answer is None, **VARS)


def test_gemma_ids_differ_only_where_a_model_turn_starts(formats):
    fmt = formats["gemma3"]
    tok = fmt.tokenizer
    ids = fmt.prompt_ids("Hi", CALC_TOOLS) + fmt.action_ids("<call calc>1+2</call>", CALC_TOOLS)
    messages = [*fmt.prompt_messages("Hi", CALC_TOOLS), fmt.assistant_message("<call calc>1+2</call>", CALC_TOOLS)]
    whole = tok.encode_chat(messages, **VARS)
    assert tok.decode(whole, skip_special_tokens=False) == tok.decode(ids, skip_special_tokens=False) + "\n"
    start = len(tok.decode(fmt.prompt_ids("Hi", CALC_TOOLS), skip_special_tokens=False))
    cuts = {len(tok.decode(whole[:k], skip_special_tokens=False)) for k in range(len(whole))}
    assert start not in cuts  # one token spans the end of the generation prompt and the turn
    assert whole[: len(ids)] != ids


# -- parsing -------------------------------------------------------------------------------

ORACLE_LIKE = [
    "<call calc>1+2</call>",
    "<call calc>12*(3+4)</call>",
    "<answer>84</answer>",
    "<call guess>50</call>",
    "<call run>def f(s): return s[::-1]\nprint(f('ab'))</call>",
    "<answer>def f(x): return x+1</answer>",
    '<call calc>"quoted" \\ ü {x} </call>',
]


@pytest.mark.parametrize("family", FAMILIES)
def test_actions_round_trip(formats, family):
    fmt = formats[family]
    for text in ORACLE_LIKE:
        ids = fmt.action_ids(text, TOOLS)
        assert fmt.is_turn_end(ids) and not any(fmt.is_turn_end(ids[:n]) for n in range(len(ids)))
        assert fmt.env_action(ids, TOOLS) == parse_action(text), text


def _call(family: str, body: str) -> str:
    return body if family == "llama3" else f"<tool_call>\n{body}\n</tool_call>"


def _key(family: str) -> str:
    return "parameters" if family == "llama3" else "arguments"


@pytest.mark.parametrize("family", FAMILIES)
def test_malformed_calls(formats, family):
    fmt, key = formats[family], _key(family)

    def action(body, end=True):
        return fmt.env_action(generated(fmt, _call(family, body), end), TOOLS)

    good = json.dumps({"name": "calc", key: {"expression": "1+2"}})
    cases = {
        "not valid JSON": _call(family, f'{{"name": "calc", "{key}": {{"expression": '),
        "exactly one argument": _call(family, json.dumps({"name": "calc", key: {}})),
        "exactly one argument, expression": _call(family, json.dumps({"name": "calc", key: {"expr": "1"}})),
        "exactly the keys": _call(family, json.dumps({"name": "calc", key: {"expression": "1"}, "id": 3})),
        "must be a string": _call(family, json.dumps({"name": "calc", key: {"expression": [1]}})),
        "must be a JSON object": _call(family, json.dumps({"name": "calc", key: "1+2"})),
        "non-empty string": _call(family, json.dumps({"name": 7, key: {"expression": "1"}})),
    }
    if family != "llama3":
        cases["not closed"] = '<tool_call>\n{"name": "calc"'
        cases["never opened"] = "84</tool_call>"
    for reason, text in cases.items():
        got = fmt.env_action(generated(fmt, text), TOOLS)
        assert isinstance(got, Malformed) and reason in got.reason, (reason, got)
        assert "<" not in got.reason and ">" not in got.reason
    assert action(good) == ToolCall("calc", "1+2")
    assert action(good, end=False) == Malformed("reply cut off before its end of turn")
    two = good + ("\n" if family == "llama3" else "\n</tool_call>\n<tool_call>\n") + good
    assert action(two) == Malformed("only one tool call per turn")
    assert action(json.dumps({"name": "calc", key: {"expression": 12}})) == ToolCall("calc", "12")
    assert action(json.dumps({"name": "guess", key: {"number": True}})) == ToolCall("guess", "True")
    unknown = json.dumps({"name": "search", key: {"q": "x"}})
    assert action(unknown) == ToolCall("search", '{"q": "x"}')
    assert fmt.env_action(generated(fmt, "  It is 84.\n"), TOOLS) == FinalAnswer("It is 84.")
    assert fmt.env_action([], TOOLS) == Malformed("reply cut off before its end of turn")


def test_qwen3_reasoning_is_not_the_answer(formats):
    fmt = formats["qwen3"]
    assert fmt.env_action(generated(fmt, "<think>\n6*7?\n</think>\n\n42"), TOOLS) == FinalAnswer("42")
    call = '<think>\nuse the tool\n</think>\n\n<tool_call>\n{"name": "calc", "arguments": {"expression": "6*7"}}'
    call += "\n</tool_call>"
    assert fmt.env_action(generated(fmt, call), TOOLS) == ToolCall("calc", "6*7")
    assert fmt.env_action(generated(fmt, "<think>\nstill thinking"), TOOLS) == Malformed("reasoning not closed")


FRAGMENTS = ["<tool_call>", "</tool_call>", "<think>", "</think>", "{", "}", "[", '"name"', '"calc"', ": ", ", "]
FRAGMENTS += ['"arguments"', '"parameters"', '"expression"', '"1+2"', "12", "\n", "null", "<|python_tag|>", "x"]


@pytest.mark.parametrize("family", FAMILIES)
@SLOW
@given(data=st.data())
def test_any_turn_parses_to_an_action(formats, family, data):
    fmt = formats[family]
    ids = data.draw(st.lists(st.integers(0, fmt.tokenizer.vocab_size - 1), max_size=40))
    text = data.draw(st.one_of(texts, st.lists(st.sampled_from(FRAGMENTS), max_size=14).map("".join)))
    end = data.draw(st.booleans())
    for turn in (ids, generated(fmt, text, end), ids + [fmt.tokenizer.eos_ids[-1]]):
        assert isinstance(fmt.env_action(turn, TOOLS), ToolCall | FinalAnswer | Malformed)
        fmt.is_turn_end(turn)


# -- environments: steps, tools, episodes --------------------------------------------------


def test_step_takes_a_parsed_action():
    env = CalculatorEnv()
    task = environments.generate_tasks(0, 1)[0]
    asyncio.run(env.reset(task))
    bad = asyncio.run(env.step(Malformed("tool call is not valid JSON")))
    assert bad.observation == "<error>tool call is not valid JSON</error>" and not bad.done
    assert bad.info["malformed_calls"] == 1 and bad.info["turns"] == 1
    other = asyncio.run(env.step(ToolCall("search", "x")))
    assert other.info["unknown_tool_calls"] == 1 and other.observation.startswith("<error>")
    assert asyncio.run(env.step(ToolCall("calc", "2+3"))).observation == "<result>5</result>"
    assert asyncio.run(env.step(FinalAnswer(task.target))).reward == 1.0


@pytest.mark.parametrize("name", ["calculator", "code", "guess"])
def test_tools_schema(name, formats):
    env = environments.make(name)
    [tool] = env.tools()
    function = tool["function"]
    assert tool["type"] == "function" and function["name"] == env.tool_name and function["description"]
    parameters = function["parameters"]
    [argument] = parameters["properties"]
    assert parameters["type"] == "object" and parameters["required"] == [argument] == [env.tool_argument]
    assert parameters["properties"][argument]["type"] == "string" and parameters["properties"][argument]["description"]
    json.dumps(tool)
    for fmt in formats.values():
        prompt = fmt.tokenizer.decode(fmt.prompt_ids("Go.", env.tools()), skip_special_tokens=False)
        assert f'"{env.tool_name}"' in prompt and function["description"] in prompt


def test_plain_environments_have_no_tools():
    class Plain(Environment):
        async def reset(self, task):
            return ""

        async def step(self, action_text):
            raise NotImplementedError

    assert Plain().tools() == []


async def _oracle_episode(fmt, name, task, max_turns=10):
    """An oracle episode as the rollout side runs one: ids in, ids out."""
    env, oracle = environments.make(name), environments.oracle(name)
    tools = env.tools()
    ids, observations = fmt.prompt_ids(await env.reset(task), tools), []
    for _ in range(max_turns):
        action = fmt.action_ids(oracle(task, observations), tools)
        ids += action
        result = await env.step(fmt.env_action(action, tools))
        if result.done:
            return result, ids
        ids += fmt.observation_ids(result.observation)
        observations.append(result.observation)
    raise AssertionError("the oracle did not finish")


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("name", ["calculator", "guess", "code"])
def test_oracle_episode_through_the_native_format(formats, family, name):
    if name == "code" and sandbox.BWRAP_PATH is None:
        pytest.skip("bubblewrap is not installed: no sandbox for the code environment")
    task = environments.make_tasks(name, 0, 1)[0]
    result, ids = asyncio.run(_oracle_episode(formats[family], name, task))
    assert result.reward == 1.0 and result.info["malformed_calls"] == 0 and result.info["unknown_tool_calls"] == 0
    assert ids[-1] in formats[family].tokenizer.eos_ids


# -- the byte format is the old behaviour --------------------------------------------------


def _old_end_of_turn(generated: list[int]) -> bool:  # rollout/episodes.py before chat formats
    if generated and generated[-1] == EOS:
        return True
    text = BYTE_TOKENIZER.decode(generated[-16:])
    return any(text.endswith(s) for s in TURN_STOP_STRINGS)


@pytest.mark.parametrize("name", ["calculator", "guess"])
def test_byte_format_is_the_old_behaviour_on_oracle_episodes(name):
    fmt = ByteFormat()
    for task in environments.make_tasks(name, 1, 3):
        result, ids = asyncio.run(_oracle_episode(fmt, name, task))
        assert result.reward == 1.0
        assert ids[: 1 + len(task.prompt.encode())] == [BOS, *task.prompt.encode()]
        env, observations = environments.make(name), []
        asyncio.run(env.reset(task))
        for _ in range(8):
            text = environments.oracle(name)(task, observations)
            action = fmt.action_ids(text, env.tools())
            assert action == list(text.encode()) and fmt.env_action(action, []) == text
            assert [fmt.is_turn_end(action[:n]) for n in range(1, len(action) + 1)] == [
                _old_end_of_turn(action[:n]) for n in range(1, len(action) + 1)
            ]
            step = asyncio.run(env.step(text))
            if step.done:
                break
            assert fmt.observation_ids(step.observation) == list(step.observation.encode())
            observations.append(step.observation)


@settings(max_examples=200, deadline=None)
@given(ids=st.lists(st.sampled_from([*b"</call>answer x", EOS, BOS, 0xC3, 0xA9]), max_size=40))
def test_byte_turn_end_and_action_are_the_old_ones(ids):
    fmt = ByteFormat()
    assert fmt.is_turn_end(ids) == _old_end_of_turn(ids)
    assert fmt.env_action(ids, TOOLS) == BYTE_TOKENIZER.decode(ids)
