"""Guess-the-number with higher/lower feedback: a multi-turn game where every turn counts.

    prompt:  Guess my number in 1..100.
    model:   <call guess>50</call>
    env:     <result>lower</result>        (the secret is lower than 50)
    model:   <call guess>25</call>
    env:     <result>correct</result>      -> reward 1.0, done

`<answer>N</answer>` is a final guess: reward 1.0 if right, else 0.0; either way the episode
ends. Binary search wins any range of width w in floor(log2(w)) + 1 guesses (7 for 1..100),
so the default 8 turns leave one turn of slack, while random guessing mostly loses.

`GuessConfig.shaping` (0 by default) is the environment's documented reward shaping, a
distance signal: each guess earns `shaping` times the share of the range it rules out, on
a log scale (bits gained over the bits the range holds), so a lost game that bisected
well scores more than one that repeated guesses or left the feasible window. A found
number tops the episode's reward up to exactly 1.0; a lost game scores at most `shaping`.
Success (what held-out evaluation counts) stays "the number was found".

`GuessConfig.reply_window` (off by default) is an easier game of the same length: a
wrong guess is answered with the numbers still possible (`<result>20..31</result>`, what
the replies so far leave) instead of higher/lower, so a player need not remember its
earlier guesses, only halve the window it is shown. The reply is as long as "higher".

Each task carries its own range, a window of `GuessConfig`'s [low, high] (1..100 by
default). That is what makes disjoint train/test splits possible: 100 secrets alone would
give only ~20 test tasks, (range, secret) triples give ~160k.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import random
import re

from environments.base import Task
from environments.fields import bounded, check_fields
from environments.latency import LatencyModel, as_latency_model
from environments.tool_calls import format_error, format_result
from environments.tool_env import ToolEnvironment

TOOL_NAME = "guess"
DEFAULT_LOW, DEFAULT_HIGH = 1, 100
_INT_RE = re.compile(r"[+-]?[0-9]{1,32}\Z")  # ASCII only: int() would take "８" or "1_0".


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


@dataclasses.dataclass(frozen=True)
class GuessConfig:
    low: int = DEFAULT_LOW  # Bounds every task's range (and is the range of a task
    high: int = DEFAULT_HIGH  # that states none in its meta).
    max_turns: int = bounded(8, ge=1)
    shaping: float = bounded(0.0, ge=0, lt=1)  # reward for the range ruled out, at most this over a lost game
    reply_window: bool = False  # a wrong guess's reply is the window still possible
    tool_latency: LatencyModel = dataclasses.field(default_factory=LatencyModel)

    def __post_init__(self) -> None:
        object.__setattr__(self, "tool_latency", as_latency_model(self.tool_latency))
        check_fields(self)
        if self.low > self.high:
            raise ValueError(f"GuessConfig needs low <= high, got {self.low} > {self.high}")


def parse_int(text: str) -> int | None:
    s = text.strip()
    return int(s) if _INT_RE.match(s) else None


def task_range(task: Task, low: int = DEFAULT_LOW, high: int = DEFAULT_HIGH) -> tuple[int, int]:
    """The task's (low, high) from its meta, or the given defaults for a bare task."""
    lo, hi = task.meta.get("low", low), task.meta.get("high", high)
    if not (_is_int(lo) and _is_int(hi)) or lo > hi:
        raise ValueError(f"task {task.task_id!r}: bad range {lo!r}..{hi!r}")
    return lo, hi


def guesses_needed(width: int) -> int:
    """Worst-case guesses of binary search over `width` numbers."""
    return width.bit_length()


class GuessEnv(ToolEnvironment):
    name = "guess"
    tool_name = TOOL_NAME
    tool_description = "Guess the secret number: the reply is higher, lower or correct."
    tool_argument = "number"
    tool_argument_description = "the guess, an integer in the task's range"

    def __init__(self, config: GuessConfig | None = None) -> None:
        super().__init__(config or GuessConfig())
        if self.config.reply_window:
            self.tool_description = (
                "Guess the secret number: the reply is correct or the numbers still possible (lo..hi)."
            )

    async def reset(self, task: Task) -> str:
        # A task this env cannot play is a programming/config error, not model output.
        low, high = task_range(task, self.config.low, self.config.high)
        if low < self.config.low or high > self.config.high:
            raise ValueError(
                f"task {task.task_id!r}: range {low}..{high} is outside the "
                f"configured {self.config.low}..{self.config.high}"
            )
        secret = parse_int(task.target)
        if secret is None or not low <= secret <= high:
            raise ValueError(f"task {task.task_id!r}: target {task.target!r} is not an integer in {low}..{high}")
        self._low, self._high, self._secret = low, high, secret
        self._feasible, self._earned = (low, high), 0.0  # the window the replies leave; shaping paid
        return self._start(task, found=False)

    def success(self, reward: float, info: dict) -> bool:
        return bool(info.get("found"))  # not the shaped reward: a lost game may score > 0

    def _found(self) -> float:
        self._info["found"] = True
        return 1.0 - self._earned  # the episode's rewards sum to exactly 1.0

    def _progress(self, guess: int) -> float:
        """The shaping for a wrong guess: the bits it rules out of the feasible window."""
        lo, hi = self._feasible
        if lo <= guess <= hi:
            self._feasible = (guess + 1, hi) if guess < self._secret else (lo, guess - 1)
        if not self.config.shaping or self._high == self._low:
            return 0.0
        before, after = hi - lo + 1, self._feasible[1] - self._feasible[0] + 1
        reward = self.config.shaping * math.log2(before / after) / math.log2(self._high - self._low + 1)
        self._earned += reward
        return reward

    async def score_answer(self, text: str) -> float:
        return self._found() if parse_int(text) == self._secret else 0.0

    async def call_tool(self, args: str) -> tuple[str, float, bool]:
        guess = parse_int(args)
        if guess is None or not self._low <= guess <= self._high:
            self._info["tool_errors"] += 1
            what = "an integer" if guess is None else "in range"
            return format_error(f"guess must be {what} {self._low}..{self._high}"), 0.0, False
        if guess == self._secret:
            return format_result("correct"), self._found(), True
        reward = self._progress(guess)  # narrows the feasible window
        if self.config.reply_window:
            return format_result("{}..{}".format(*self._feasible)), reward, False
        return format_result("higher" if guess < self._secret else "lower"), reward, False


# --- Task generation -------------------------------------------------------------------

SPLITS = ("train", "test")
MIN_WIDTH = 16  # Narrower ranges would be won by luck too often to teach search.
_TEST_PERCENT = 20


def _split_of(key: str) -> str:
    # Split by a stable hash of (range, secret): train and test are disjoint for ANY seeds.
    h = int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big")
    return "test" if h % 100 < _TEST_PERCENT else "train"


def generate_tasks(
    seed: int, n: int, split: str = "train", *, low: int = DEFAULT_LOW, high: int = DEFAULT_HIGH
) -> list[Task]:
    """`n` distinct tasks (a window of [low, high] and a secret in it), deterministic per
    (seed, split, low, high). Windows are at least MIN_WIDTH wide (or all of [low, high])."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    if not _is_int(n) or n < 0:
        raise ValueError(f"n must be an int >= 0, got {n!r}")
    if not (_is_int(low) and _is_int(high)) or low > high:
        raise ValueError(f"need int low <= high, got {low!r}..{high!r}")
    full = high - low + 1
    min_width = min(MIN_WIDTH, full)
    rng = random.Random(f"guess:{seed}:{split}:{low}:{high}")
    tasks: list[Task] = []
    seen: set[str] = set()
    attempts = 0
    while len(tasks) < n:
        attempts += 1
        if attempts > 50 * n + 1000:
            raise ValueError(f"cannot draw {n} distinct {split} tasks in {low}..{high}")
        width = rng.randint(min_width, full)
        lo = rng.randint(low, high - width + 1)
        hi = lo + width - 1
        secret = rng.randint(lo, hi)
        key = f"{lo}..{hi}:{secret}"
        if key in seen or _split_of(key) != split:
            continue
        seen.add(key)
        digest = hashlib.sha256(key.encode()).hexdigest()[:12]
        tasks.append(
            Task(
                task_id=f"guess-{split}-{digest}",
                prompt=f"Guess my number in {lo}..{hi}. ",
                target=str(secret),
                meta={"low": lo, "high": hi, "secret": secret},
            )
        )
    return tasks


_WINDOW_RE = re.compile(re.escape(format_result("@")).replace("@", r"([0-9]+)\.\.([0-9]+)"))


def oracle_action(task: Task, observations: list[str]) -> str:
    """The scripted expert: binary search, replaying its own earlier guesses from the
    higher/lower replies so far (the prompt excluded), or taking the window a reply names
    (reply_window). Anything else carries no information, so the same guess is repeated."""
    lo, hi = task_range(task)
    for obs in observations:
        mid = (lo + hi) // 2
        window = _WINDOW_RE.fullmatch(obs)
        if window:
            lo, hi = int(window[1]), int(window[2])
        elif obs == format_result("higher"):
            lo = mid + 1
        elif obs == format_result("lower"):
            hi = mid - 1
    if lo > hi:  # Replies not produced by this oracle's guesses: fall back to the answer.
        return f"<answer>{task.target}</answer>"
    return f"<call {TOOL_NAME}>{(lo + hi) // 2}</call>"
