"""The model's own chat format, token in / token out: what an episode appends, when a model
turn ends, and what the environment makes of the turn.

An episode is: `prompt_ids(prompt, tools)`, then per turn the model's sampled ids (ended
when `is_turn_end`), `env_action(ids, tools)` for the environment, and, unless the episode
ended, `observation_ids(observation)`. Sampled ids are kept as sampled and only parsed,
never re-tokenised, so the learner trains on exactly what the model wrote.

  - `ByteFormat` (the byte tokenizer): the project's own `<call NAME>ARGS</call>` /
    `<answer>TEXT</answer>` text (environments/tool_calls.py), as before.
  - `NativeFormat` (a checkpoint's tokenizer): the family's chat template and tool-call
    syntax (core/policy/text/tool_call_formats.py). Every text it appends is cut out of the
    template's own renderings of small conversations, so any template of a supported style
    works; the template is probed once, at construction.

Where a template is not append-only (rendering more of a conversation rewrites what came
before), the episode keeps the incremental ids (what the model saw and wrote) and
`NativeFormat.rewrites` says where a whole-conversation rendering differs. Qwen3's is one:
its assistant turns open with an empty `<think>\\n\\n</think>\\n\\n` (the template writes
it for the last assistant turn, so a cloned action carries it), which a rendering of the
whole conversation drops from every assistant turn that a tool result follows.
"""

from __future__ import annotations

import abc
import re
from collections.abc import Mapping, Sequence
from typing import Any

from core.policy.text.tokenizer import BYTE_TOKENIZER, ByteTokenizer, Tokenizer
from core.policy.text.tool_call_formats import HERMES, LLAMA3, QWEN, ToolCallStyle, call_arguments
from environments.tool_calls import MAX_SCAN_CHARS, TURN_STOP_STRINGS, Action, FinalAnswer, Malformed, parse_action

# Small conversations the template is probed with. The sentinel must survive rendering
# untouched (no whitespace to trim, no tag, no special token).
_PROBE_PROMPT = "Probe prompt."
_PROBE_SENTINEL = "Q7xObservationSentinel"
_PROBE_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "probe",
            "description": "A probe tool.",
            "parameters": {"type": "object", "properties": {"x": {"type": "string"}}, "required": ["x"]},
        },
    }
]
_STOP_TAIL_TOKENS = 16  # longer than any stop string in bytes: the tail decides a byte turn's end


class ChatFormat(abc.ABC):
    """How an episode's tokens are laid out for one tokenizer (see the module docstring)."""

    name: str  # "byte", "qwen", "llama3", "hermes"
    native: bool  # False only for the byte format: env.step then gets text
    tokenizer: Tokenizer

    @abc.abstractmethod
    def prompt_ids(self, prompt: str, tools: Sequence[dict]) -> list[int]:
        """The episode's first tokens, up to where the model starts writing."""

    @abc.abstractmethod
    def is_turn_end(self, generated: list[int]) -> bool:
        """Whether the turn's ids so far end it (called after every sampled token: cheap)."""

    def stop_sequences(self) -> tuple[tuple[int, ...], ...]:
        """Token-id sequences that end a turn when the turn's ids end with one: what a
        device may check between host round trips (core/policy/sampling/decode_loop.py). Speed only:
        `is_turn_end` stays the judge, and may end a turn where none of these does."""
        return ()

    @abc.abstractmethod
    def env_action(self, generated: list[int], tools: Sequence[dict]) -> str | Action:
        """What the environment's `step` gets for one turn's ids. Never raises."""

    @abc.abstractmethod
    def observation_ids(self, observation: str) -> list[int]:
        """Tokens appended after a turn that did not end the episode, up to where the
        model writes again."""

    @abc.abstractmethod
    def action_ids(self, action_text: str, tools: Sequence[dict]) -> list[int]:
        """An oracle's action text (`<call calc>1+2</call>`, `<answer>3</answer>`) as this
        model writes it, end of turn included: `env_action` of it is `parse_action(text)`."""


class ByteFormat(ChatFormat):
    """The byte tokenizer's text protocol, exactly as episodes have always run it."""

    name = "byte"
    native = False

    def __init__(self, tokenizer: Tokenizer = BYTE_TOKENIZER):
        self.tokenizer = tokenizer

    def prompt_ids(self, prompt: str, tools: Sequence[dict]) -> list[int]:
        return [self.tokenizer.bos_id, *self.tokenizer.encode(prompt)]  # tools: learnt in the warm start

    def is_turn_end(self, generated: list[int]) -> bool:
        if generated and generated[-1] in self.tokenizer.eos_ids:
            return True
        text = self.tokenizer.decode(generated[-_STOP_TAIL_TOKENS:])
        return any(text.endswith(s) for s in TURN_STOP_STRINGS)

    def stop_sequences(self) -> tuple[tuple[int, ...], ...]:
        # The stop strings as their bytes (text ending with one nearly always means its bytes
        # end the ids), and the eos ids.
        strings = tuple(tuple(self.tokenizer.encode(s)) for s in TURN_STOP_STRINGS)
        return strings + tuple((int(i),) for i in self.tokenizer.eos_ids)

    def env_action(self, generated: list[int], tools: Sequence[dict]) -> str:
        return self.tokenizer.decode(generated)

    def observation_ids(self, observation: str) -> list[int]:
        return self.tokenizer.encode(observation)

    def action_ids(self, action_text: str, tools: Sequence[dict]) -> list[int]:
        return self.tokenizer.encode(action_text)  # the stop string ends the turn


class NativeFormat(ChatFormat):
    """A checkpoint's chat template and tool-call `style`. `system`: an optional system
    prompt for every episode; `template_vars`: variables every rendering gets (e.g.
    `enable_thinking=False`, a fixed `date_string`)."""

    native = True

    def __init__(
        self,
        tokenizer: Tokenizer,
        style: ToolCallStyle,
        *,
        system: str | None = None,
        template_vars: Mapping[str, Any] | None = None,
    ):
        self.tokenizer, self.style, self.name = tokenizer, style, style.name
        self.system = system
        self.template_vars = dict(template_vars or {})
        self._eos = frozenset(int(i) for i in tokenizer.eos_ids)
        texts = (tokenizer.decode([i], skip_special_tokens=False) for i in tokenizer.eos_ids)
        self._eot_texts = tuple(t for t in texts if t)
        self._eot_re = re.compile("|".join(re.escape(t) for t in self._eot_texts) or "$^")
        self._system_in_user = False
        self.rewrites: tuple[str, ...] = ()  # where the template is not append-only
        self._probe()

    # -- messages (HF's format), as the episode's conversation holds them ------------------

    def prompt_messages(self, prompt: str, tools: Sequence[dict]) -> list[dict]:
        system = self.style.system_text(tools, self.system)
        if system is None:
            return [{"role": "user", "content": prompt}]
        if self._system_in_user:  # the template has no system role
            return [{"role": "user", "content": f"{system}\n\n{prompt}"}]
        return [{"role": "system", "content": system}, {"role": "user", "content": prompt}]

    def assistant_message(self, action_text: str, tools: Sequence[dict]) -> dict:
        """The assistant message of an oracle's action text."""
        action = parse_action(action_text)
        if isinstance(action, FinalAnswer):
            return {"role": "assistant", "content": action.text}
        if isinstance(action, Malformed):
            raise ValueError(f"not an action ({action.reason}): {action_text[:80]!r}")
        return self.style.call_message(action.name, call_arguments(tools, action.name, action.args))

    def observation_message(self, observation: str) -> dict:
        return self.style.observation_message(observation)

    def render(self, messages: Sequence[Mapping], tools: Sequence[dict], add_generation_prompt: bool = False) -> str:
        tools = self.style.template_tools(tools)
        return self.tokenizer.render_chat(messages, tools, add_generation_prompt, **self.template_vars)

    # -- the ChatFormat API ----------------------------------------------------------------

    def prompt_ids(self, prompt: str, tools: Sequence[dict]) -> list[int]:
        return self.tokenizer.encode(self.render(self.prompt_messages(prompt, tools), tools, True))

    def is_turn_end(self, generated: list[int]) -> bool:
        return bool(generated) and generated[-1] in self._eos

    def stop_sequences(self) -> tuple[tuple[int, ...], ...]:
        return tuple((i,) for i in sorted(self._eos))

    def env_action(self, generated: list[int], tools: Sequence[dict]) -> Action:
        try:
            if not generated or generated[-1] not in self._eos:
                return Malformed("reply cut off before its end of turn")
            # Bounded: a token is at least one character of the capped text.
            text = self.tokenizer.decode(list(generated[:-1])[:MAX_SCAN_CHARS], skip_special_tokens=True)
            return self.style.parse(text[:MAX_SCAN_CHARS], tools)
        except Exception as e:  # defence in depth: a parser bug must not kill an episode
            return Malformed(f"unparseable reply ({type(e).__name__})")

    def observation_ids(self, observation: str) -> list[int]:
        messages = [*self._obs_history, self.style.observation_message(observation)]
        text = self.render(messages, _PROBE_TOOLS, True)
        # The tool turn starts after the history's last end-of-turn token; counted, not
        # compared, since the history may hold the date (Llama's template reads the clock).
        ends = self._eot_re.finditer(text)
        start = next((m.end() for n, m in enumerate(ends, 1) if n == self._obs_history_eots), None)
        if start is None:
            raise ValueError(f"{self.tokenizer.name}: its chat template rewrites earlier turns for this observation")
        return self.tokenizer.encode(text[start:])

    def action_ids(self, action_text: str, tools: Sequence[dict]) -> list[int]:
        conversation = self.prompt_messages(_PROBE_PROMPT, tools)
        head = self.render(conversation, tools, True)
        full = self.render([*conversation, self.assistant_message(action_text, tools)], tools)
        if not full.startswith(head):
            raise ValueError(f"{self.tokenizer.name}: its chat template rewrites the prompt once the model answers")
        return self.tokenizer.encode(self._cut_after_eot(full[len(head) :], "the action"))

    # -- probing the template --------------------------------------------------------------

    def _cut_after_eot(self, turn: str, what: str) -> str:
        """`turn` up to and including its end-of-turn token (dropping what the template
        writes after it, e.g. Qwen's newline, which the model never writes)."""
        if not turn.endswith(self._after_eot):
            raise ValueError(f"{self.tokenizer.name}: {what} does not end as a probed assistant turn does")
        turn = turn[: len(turn) - len(self._after_eot)]
        if not any(turn.endswith(t) for t in self._eot_texts):
            raise ValueError(f"{self.tokenizer.name}: {what} does not end with an end-of-turn token")
        return turn

    def _probe(self) -> None:
        where = f"{self.tokenizer.name} ({self.name} tool calls)"
        if not self._eot_texts:
            raise ValueError(f"{where}: its eos ids decode to no text, so no turn end can be found")
        try:
            self._probe_renderings(where)
        except ValueError:
            raise
        except Exception as e:  # a template refusing a message shape raises its own errors
            raise ValueError(f"{where}: its chat template cannot render a probe conversation: {e}") from None

    def _probe_renderings(self, where: str) -> None:
        tools = _PROBE_TOOLS
        if self.style.system_text(tools, self.system) is not None:
            try:
                self.render(self.prompt_messages(_PROBE_PROMPT, tools), tools, True)
            except Exception:  # e.g. Gemma 2: "System role not supported"
                self._system_in_user = True
        conversation = self.prompt_messages(_PROBE_PROMPT, tools)
        call = self.style.call_message("probe", {"x": "1"})
        answer = {"role": "assistant", "content": "Probe answer."}
        observation = self.style.observation_message(_PROBE_SENTINEL)
        before = self.render(conversation, tools)
        prompt = self.render(conversation, tools, True)
        if not prompt.startswith(before):
            raise ValueError(f"{where}: the generation prompt rewrites the conversation before it")
        generation_prompt = prompt[len(before) :]
        after_call = self.render([*conversation, call], tools)
        if not after_call.startswith(prompt):
            raise ValueError(f"{where}: an assistant turn rewrites the prompt before it (not append-only)")
        eots = [m.end() for m in self._eot_re.finditer(after_call, len(prompt))]
        if not eots:
            raise ValueError(f"{where}: an assistant turn does not end with an eos token {self._eot_texts}")
        self._after_eot = after_call[eots[-1] :]

        with_obs = self.render([*conversation, call, observation], tools, True)
        if with_obs.count(_PROBE_SENTINEL) != 1 or not with_obs.endswith(generation_prompt):
            raise ValueError(f"{where}: a tool result does not render as its text then the generation prompt")
        self._obs_history = [*conversation, call]
        self._obs_history_eots = len(self._eot_re.findall(with_obs, 0, with_obs.index(_PROBE_SENTINEL)))
        if not self._obs_history_eots:
            raise ValueError(f"{where}: no eos token {self._eot_texts} ends the assistant turn before a tool result")
        rewrites = []
        if not with_obs.startswith(after_call):
            rewrites.append("a tool result " + _difference(after_call, with_obs, "the assistant turn before it"))
        final = self.render([*conversation, call, observation, answer], tools)
        if not final.startswith(with_obs):
            rewrites.append("a final answer " + _difference(with_obs, final, "the conversation before it"))
        self.rewrites = tuple(rewrites)
        self._cut_after_eot(final[len(with_obs) :], "a final answer")


def _difference(before: str, after: str, what: str) -> str:
    at = next((i for i, (a, b) in enumerate(zip(before, after)) if a != b), min(len(before), len(after)))
    for end in range(at + 1, len(before) + 1):  # a dropped piece? (renderings are short: quadratic is fine)
        if after.startswith(before[:at] + before[end:]):
            while at > 0 and before[at - 1] == before[end - 1]:  # the same drop, further left
                at, end = at - 1, end - 1
            # name it from a visible start
            while end < len(before) and before[at].isspace() and before[at] == before[end]:
                at, end = at + 1, end + 1
            return f"rewrites {what}: drops {before[at:end]!r}"
    return f"rewrites {what}: {before[at : at + 40]!r} becomes {after[at : at + 40]!r}"


def detect_style(template: str) -> ToolCallStyle | None:
    """The tool-call style a chat template's text supports; None when it supports tools in
    a way this module does not know."""
    if "<tool_call>" in template and "<tool_response>" in template:
        return QWEN
    if "ipython" in template and "parameters" in template:
        return LLAMA3
    if not re.search(r"\btools\b|\btool_calls\b|['\"]tool['\"]", template):
        return HERMES  # no tool support at all: describe the tools in text
    return None


def chat_format_for(
    tokenizer: Tokenizer, *, system: str | None = None, template_vars: Mapping[str, Any] | None = None
) -> ChatFormat:
    """The byte tokenizer's format, or the style its chat template supports for an HF one."""
    if isinstance(tokenizer, ByteTokenizer):
        return ByteFormat(tokenizer)
    template = tokenizer.chat_templates.get("tool_use") or tokenizer.chat_template
    if template is None:
        raise ValueError(f"{tokenizer.name} has no chat template: it has no chat format for episodes")
    style = detect_style(template)
    if style is None:
        raise ValueError(f"{tokenizer.name}: its chat template's tool-call syntax is none of qwen, llama3 or hermes")
    return NativeFormat(tokenizer, style, system=system, template_vars=template_vars)
