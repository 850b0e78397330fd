"""Multi-turn arithmetic with one tool, `calc`: the walking-skeleton environment.

    prompt:  Compute 12*(3+4).
    model:   <call calc>12*(3+4)</call>
    env:     <result>84</result>          (after the injected tool latency)
    model:   <answer>84</answer>          -> reward 1.0, done

Expressions are evaluated by walking a Python `ast` with a whitelist (int literals,
+ - * // %, unary minus, parentheses) and a magnitude bound; nothing model-written is
ever passed to eval/exec.
"""

from __future__ import annotations

import ast
import dataclasses
import hashlib
import random
import re

from environments.base import Task
from environments.fields import bounded, check_fields
from environments.latency import LatencyModel, as_latency_model
from environments.tool_calls import format_error, format_result
from environments.tool_env import ToolEnvironment

TOOL_NAME = "calc"
MAX_ABS_VALUE = 10**12  # Bounds every literal and intermediate: no giant-int CPU burn.
_INT_ANSWER_RE = re.compile(r"[+-]?[0-9]{1,32}\Z")  # ASCII only: int() would take "８" or "1_0".
MAX_TASK_OPS = 4  # operations in one task: prompts stay short (<= 24 chars), values small.


@dataclasses.dataclass(frozen=True)
class CalculatorConfig:
    max_turns: int = bounded(4, ge=1)
    tool_latency: LatencyModel = dataclasses.field(default_factory=LatencyModel)
    max_expression_chars: int = bounded(64, ge=1)
    # The tool does this many binary operations per call: with 1, a task with two
    # operators needs two calls (multi-step tool use), the result of one feeding the next.
    max_ops_per_call: int = bounded(1, ge=1)
    # The tasks' shape (operations per task), read by the task generator from the same
    # env_config; here so that config is accepted and checked in one place.
    min_ops: int = bounded(1, ge=1, le=MAX_TASK_OPS)
    max_ops: int = bounded(2, ge=1, le=MAX_TASK_OPS)

    def __post_init__(self) -> None:
        object.__setattr__(self, "tool_latency", as_latency_model(self.tool_latency))
        check_fields(self)
        _check_ops(self.min_ops, self.max_ops)


class CalcError(ValueError):
    """An expression the calculator refuses; the message is shown to the model."""


_BINOPS = {
    ast.Add: lambda a, b: a + b,
    ast.Sub: lambda a, b: a - b,
    ast.Mult: lambda a, b: a * b,
    ast.FloorDiv: lambda a, b: a // b,
    ast.Mod: lambda a, b: a % b,
}


def safe_eval(expr: str, max_chars: int = 64, max_ops: int | None = None) -> int:
    """Evaluate integer arithmetic; raise CalcError with a short reason on anything else."""
    expr = expr.strip()
    if not expr:
        raise CalcError("empty expression")
    if len(expr) > max_chars:  # Checked before parsing: ast.parse cost grows with input.
        raise CalcError(f"expression longer than {max_chars} chars")
    try:
        tree = ast.parse(expr, mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        raise CalcError("syntax error") from None
    if max_ops is not None and sum(isinstance(n, ast.BinOp) for n in ast.walk(tree)) > max_ops:
        raise CalcError(f"at most {max_ops} operation{'s' if max_ops > 1 else ''} per call")
    try:
        return _eval(tree.body)
    except RecursionError:
        raise CalcError("expression too deep") from None


def _eval(node: ast.AST) -> int:
    if isinstance(node, ast.Constant):
        if type(node.value) is not int:  # Excludes bool, float, str, bytes, None.
            raise CalcError("only integer literals are allowed")
        return _bounded(node.value)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return _bounded(-_eval(node.operand))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
        left, right = _eval(node.left), _eval(node.right)
        if right == 0 and isinstance(node.op, (ast.FloorDiv, ast.Mod)):
            raise CalcError("division by zero")
        return _bounded(_BINOPS[type(node.op)](left, right))
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
        raise CalcError("use // for division")
    raise CalcError("only integers, + - * // % and parentheses are allowed")


def _bounded(v: int) -> int:
    if abs(v) > MAX_ABS_VALUE:
        raise CalcError("number too large")
    return v


def parse_int_answer(text: str) -> int | None:
    s = text.strip()
    return int(s) if _INT_ANSWER_RE.match(s) else None


class CalculatorEnv(ToolEnvironment):
    name = "calculator"
    tool_name = TOOL_NAME
    tool_description = "Evaluate integer arithmetic with + - * // % and parentheses."
    tool_argument = "expression"
    tool_argument_description = "the expression, e.g. 12*7"

    def __init__(self, config: CalculatorConfig | None = None) -> None:
        super().__init__(config or CalculatorConfig())

    async def score_answer(self, text: str) -> float:
        guess = parse_int_answer(text)
        return float(guess is not None and guess == parse_int_answer(self._task.target))

    async def call_tool(self, args: str) -> tuple[str, float, bool]:
        # Inline, not to_thread: input is capped at max_expression_chars, so this is
        # microseconds of CPU; a thread hop would cost more than the work.
        try:
            return (
                format_result(str(safe_eval(args, self.config.max_expression_chars, self.config.max_ops_per_call))),
                0.0,
                False,
            )
        except CalcError as e:
            self._info["tool_errors"] += 1
            return format_error(str(e)), 0.0, False


# The chained game's settings (registry's `calculator_chained`): every task has 2-3
# operations and the tool does one per call, so each result must be fed into the next call.
CHAINED_DEFAULTS = {"max_ops_per_call": 1, "min_ops": 2, "max_ops": 3}


class ChainedCalculatorEnv(CalculatorEnv):
    """The calculator where no task can be done in one call (with max_ops_per_call 2 a
    warm-started model already solves the plain one greedily): the model must chain calls."""

    name = "calculator_chained"
    tool_description = (
        "Evaluate ONE integer operation (+ - * // %) per call, e.g. 12*7; "
        "for longer expressions call again with the result."
    )
    tool_argument_description = "one operation on two integers, e.g. 12*7 or 84-5"

    def __init__(self, config: CalculatorConfig | None = None) -> None:
        super().__init__(config or chained_config())


def chained_config(**kwargs) -> CalculatorConfig:
    """CHAINED_DEFAULTS overridden by `kwargs`; max_turns defaults to a call per operation,
    the answer and one spare turn, so a refused call can be retried even at max_ops."""
    settings = {**CHAINED_DEFAULTS, **kwargs}
    if "max_turns" not in settings and settings["max_ops"] in range(1, MAX_TASK_OPS + 1):
        settings["max_turns"] = settings["max_ops"] + 2  # else the config refuses max_ops itself
    return CalculatorConfig(**settings)


# --- Task generation -------------------------------------------------------------------

SPLITS = ("train", "test")
_TEST_PERCENT = 20


def _split_of(expr: str) -> str:
    # Split by a stable hash of the content: train and test are disjoint for ANY seeds.
    h = int.from_bytes(hashlib.sha256(expr.encode()).digest()[:8], "big")
    return "test" if h % 100 < _TEST_PERCENT else "train"


def _check_ops(min_ops, max_ops) -> None:
    for name, v in (("min_ops", min_ops), ("max_ops", max_ops)):
        if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= MAX_TASK_OPS:
            raise ValueError(f"{name} must be an int in [1, {MAX_TASK_OPS}], got {v!r}")
    if min_ops > max_ops:
        raise ValueError(f"min_ops ({min_ops}) must be <= max_ops ({max_ops}): operations per task")


def _random_expr(rng: random.Random, ops: tuple[int, ...] = (1, 2)) -> str:
    # Small operands and + - * keep prompts short and answers learnable by a tiny model.
    # choice over a tuple of the same length draws the same index: (1, 2) keeps old tasks.
    n_ops = rng.choice(ops)
    parts = [str(rng.randint(0, 20))]
    for _ in range(n_ops):
        parts += [rng.choice("+-*"), str(rng.randint(0, 20))]
    return "".join(parts)


def generate_tasks(seed: int, n: int, split: str = "train", *, min_ops: int = 1, max_ops: int = 2) -> list[Task]:
    """`n` distinct calculator tasks, deterministic per (seed, split), each with
    min_ops..max_ops operations (uniformly)."""
    return _generate(seed, n, split, min_ops, max_ops, "calculator")


def generate_chained_tasks(
    seed: int, n: int, split: str = "train", *, min_ops: int = 2, max_ops: int = 3
) -> list[Task]:
    """The chained game's tasks: ids `calculator_chained-...`, apart from the plain game's."""
    return _generate(seed, n, split, min_ops, max_ops, "calculator_chained")


def _generate(seed: int, n: int, split: str, min_ops: int, max_ops: int, prefix: str) -> list[Task]:
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise ValueError(f"n must be an int >= 0, got {n!r}")
    _check_ops(min_ops, max_ops)
    ops = tuple(range(min_ops, max_ops + 1))
    rng = random.Random(f"calculator:{seed}:{split}")
    tasks: list[Task] = []
    seen: set[str] = set()
    attempts = 0
    while len(tasks) < n:
        attempts += 1
        if attempts > 50 * n + 1000:
            raise ValueError(f"cannot draw {n} distinct {split} tasks; ask for fewer")
        expr = _random_expr(rng, ops)
        if expr in seen or _split_of(expr) != split:
            continue
        seen.add(expr)
        digest = hashlib.sha256(expr.encode()).hexdigest()[:12]
        tasks.append(
            Task(
                task_id=f"{prefix}-{split}-{digest}",
                prompt=f"Compute {expr}. ",
                target=str(safe_eval(expr)),
                meta={"expression": expr},
            )
        )
    return tasks


def _evaluation_plan(expr: str) -> list[tuple]:
    """The binary operations of `expr` in evaluation order, as (left, op, right) where an
    operand is an int literal or ("ref", k): the result of operation k."""
    plan: list[tuple] = []

    def visit(node):
        if isinstance(node, ast.BinOp):
            left, right = visit(node.left), visit(node.right)
            plan.append((left, _OP_SYMBOLS[type(node.op)], right))
            return ("ref", len(plan) - 1)
        return _eval(node)  # a literal, possibly negated

    visit(ast.parse(expr, mode="eval").body)
    return plan


_OP_SYMBOLS = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.FloorDiv: "//", ast.Mod: "%"}


def oracle_action(task: Task, observations: list[str]) -> str:
    """The scripted expert: one `calc` call per operation, in evaluation order, feeding
    each result into the next; then answer with the last result. `observations` are the
    environment's replies so far (the prompt excluded)."""
    plan = _evaluation_plan(task.meta["expression"])
    results = [int(r) for r in _results(observations)]
    if len(results) < len(plan):
        left, op, right = (results[x[1]] if isinstance(x, tuple) else x for x in plan[len(results)])
        return f"<call {TOOL_NAME}>{left}{op}{right}</call>"
    return f"<answer>{results[-1] if results else task.target}</answer>"


def whole_expression_action(task: Task, observations: list[str]) -> str:
    """The expert in one call: the task's whole expression to `calc`, then its result as
    the answer. What a pretrained model copies in a few dozen steps (the per-operation
    oracle's chained calls took a 135 M model past 48 steps without learning when to stop)."""
    results = _results(observations)
    if results:
        return f"<answer>{results[-1]}</answer>"
    return f"<call {TOOL_NAME}>{task.meta['expression']}</call>"


def _results(observations: list[str]) -> list[str]:
    """The tool's results among the environment's replies, in order (errors skipped)."""
    return [m.group(1) for o in observations if (m := re.fullmatch(r"<result>(-?\d+)</result>", o))]
