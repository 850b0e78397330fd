"""Conversations to render with the chat templates of each supported family (the
templates themselves are the runtime's: localstack/fixtures/chat_templates.py)."""

from __future__ import annotations

from localstack.fixtures.chat_templates import GEMMA3, LLAMA3, QWEN3, QWEN25

__all__ = ["FAMILY_CHATS", "GEMMA3", "LLAMA3", "QWEN3", "QWEN25", "TOOLS", "chat", "thinking_chat", "tool_chat"]

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "calculate",
            "description": "Evaluate an arithmetic expression & return the result <exactly>.",
            "parameters": {
                "type": "object",
                "properties": {"expression": {"type": "string", "description": "e.g. 2+3 (ünïcode ok)"}},
                "required": ["expression"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "search",
            "description": "Search the web.",
            "parameters": {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]},
        },
    },
]


def chat(system: str | None, *turns: str) -> list[dict]:
    """A plain conversation: an optional system turn, then user/assistant turns in turn."""
    head = [{"role": "system", "content": system}] if system is not None else []
    return head + [{"role": ("user", "assistant")[i % 2], "content": t} for i, t in enumerate(turns)]


def tool_chat(arguments_as_text: bool = False) -> list[dict]:
    """system, user, an assistant tool call, two tool results, an answer, a new question."""
    args = {"expression": "2+3*4"}
    call = {"type": "function", "function": {"name": "calculate", "arguments": args}}
    if arguments_as_text:
        call = {"type": "function", "function": {"name": "calculate", "arguments": '{"expression": "2+3*4"}'}}
    return [
        {"role": "system", "content": "You are a careful calculator."},
        {"role": "user", "content": "What is 2+3*4? Check it twice."},
        {"role": "assistant", "content": None, "tool_calls": [call]},  # None: dropped, as HF does
        {"role": "tool", "content": "14"},
        {"role": "tool", "content": '{"result": 14, "note": "ü <ok>"}'},
        {"role": "assistant", "content": "It is 14."},
        {"role": "user", "content": "And 1+1?"},
    ]


def thinking_chat() -> list[dict]:
    """Qwen3's reasoning: in `reasoning_content` (by another of its names) or inline <think>."""
    return [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "<think>\nthe user greets\n</think>\n\nHello!"},
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "4", "reasoning": "two and two"},
    ]


# (template, conversations it can render, conversations it refuses). Every conversation is
# rendered with and without tools and with and without the generation prompt.
FAMILY_CHATS = {
    "qwen2": ([chat("Be brief.", "Hi", "Hello!", "Bye"), chat(None, "Hi"), tool_chat(), tool_chat(True)], []),
    "qwen3": ([chat("Be brief.", "Hi", "Hello!", "Bye"), chat(None, "Hi"), tool_chat(), thinking_chat()], []),
    "llama3": ([chat("Be brief.", "Hi", "Hello!", "Bye"), chat(None, "  Hi  "), tool_chat()], []),
    "gemma3": (
        [
            chat("Be brief.", "Hi", "Hello!", "Bye"),
            chat(None, " Hi "),
            [{"role": "user", "content": [{"type": "text", "text": "parts"}, {"type": "text", "text": " two "}]}],
        ],
        [tool_chat(), chat(None, "Hi", "Hello!", "again", "x", "y")[:2] + [{"role": "assistant", "content": "z"}]],
    ),
}
