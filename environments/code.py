"""Multi-turn coding: write a small Python function, try it in a sandbox, submit it.

    prompt:  Write f(s): reverse s.
    model:   <call run>def f(s): return s[::-1]
             print(f('ab'))</call>
    env:     <result>ba</result>               (the code ran in the sandbox)
    model:   <answer>def f(s): return s[::-1]</answer>
             -> hidden tests run in ONE sandbox run; reward = fraction passed; done

Every line of model code runs only inside `environments.sandbox`. The hidden tests'
expected outputs never enter the sandbox: the harness there only reports what `f`
returned (JSON, each line tagged with a per-run random nonce) and the host compares. So
whatever the code prints or forges, it can only claim outputs, never "passed".
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import random
import secrets
from collections.abc import Callable
from typing import Any

from environments.base import Task
from environments.fields import bounded, check_fields
from environments.latency import LatencyModel, as_latency_model
from environments.sandbox import SandboxLimits, SandboxResult, run_python_async
from environments.tool_calls import format_error, format_result
from environments.tool_env import ToolEnvironment

TOOL_NAME = "run"
FUNC = "f"  # one short name for every task: the prompt stays a few bytes


@dataclasses.dataclass(frozen=True)
class CodeConfig:
    max_turns: int = bounded(4, ge=1)
    sandbox: SandboxLimits = dataclasses.field(default_factory=SandboxLimits)
    tool_latency: LatencyModel = dataclasses.field(default_factory=LatencyModel)
    max_code_chars: int = bounded(2048, ge=1)

    def __post_init__(self) -> None:
        object.__setattr__(self, "tool_latency", as_latency_model(self.tool_latency))
        if isinstance(self.sandbox, dict):  # JSON env_config: {"sandbox": {"wall_seconds": 2}}
            object.__setattr__(self, "sandbox", SandboxLimits(**self.sandbox))
        if not isinstance(self.sandbox, SandboxLimits):
            raise ValueError(f"sandbox must be SandboxLimits or a dict, got {type(self.sandbox).__name__}")
        check_fields(self)
        if 4 * self.max_code_chars > min(self.sandbox.max_file_bytes, self.sandbox.tmp_bytes // 4):
            raise ValueError(
                "CodeConfig.max_code_chars is too large for the sandbox's file "
                "limits (4 UTF-8 bytes a char must fit max_file_bytes)"
            )


# Runs in the sandbox next to solution.py and tests.json (inputs only). The user's prints
# (even raw writes to fd 1) go to stderr; the harness keeps a private dup of stdout.
HARNESS = r"""
import json, os, sys
nonce = sys.stdin.readline().strip()
out = os.dup(1)
os.dup2(2, 1)
def emit(obj):
    os.write(out, (nonce + json.dumps(obj) + "\n").encode())
spec = json.load(open("tests.json"))
ns = {"__name__": "solution"}
try:
    exec(compile(open("solution.py").read(), "solution.py", "exec"), ns)
    fn = ns[spec["func"]]
except BaseException as e:
    emit({"load_error": type(e).__name__})
    os._exit(0)
for i, args in enumerate(spec["args"]):
    try:
        emit({"i": i, "out": json.loads(json.dumps(fn(*args)))})
    except BaseException as e:
        emit({"i": i, "error": type(e).__name__})
emit({"done": len(spec["args"])})
os._exit(0)
"""


class CodeEnv(ToolEnvironment):
    name = "code"
    tool_name = TOOL_NAME
    tool_description = "Run Python code in a sandbox and show what it prints."
    tool_argument = "code"
    tool_argument_description = "the Python source to run"

    def __init__(self, config: CodeConfig | None = None) -> None:
        super().__init__(config or CodeConfig())

    async def reset(self, task: Task) -> str:
        return self._start(task, sandbox_s=0.0)

    async def score_answer(self, text: str) -> float:
        return await self._grade(text)

    def success(self, reward: float, info: dict) -> bool:
        # The reward is partial credit (the share of hidden tests passed); solved = all pass.
        return info.get("tests_total", 0) > 0 and info.get("tests_passed") == info.get("tests_total")

    async def call_tool(self, args: str) -> tuple[str, float, bool]:
        return await self._run(args), 0.0, False

    async def _sandbox(self, source: str, stdin: str = "", files=None) -> SandboxResult:
        r = await run_python_async(source, stdin, self.config.sandbox, files)
        self._info["sandbox_s"] += r.wall_s
        if not r.isolated:
            self._info["sandbox_isolated"] = False
        return r

    async def _run(self, code: str) -> str:
        if len(code) > self.config.max_code_chars:
            self._info["tool_errors"] += 1
            return format_error(f"code longer than {self.config.max_code_chars} chars")
        r = await self._sandbox(code)
        if r.status not in ("ok", "error"):
            self._info["tool_errors"] += 1
            return format_error(r.status)
        out = r.stdout.rstrip()  # trailing newlines only cost the model context
        if r.status == "error":  # the exception line is the last one: most useful to show
            lines = r.stderr.strip().splitlines()
            out = "\n".join(filter(None, [out, lines[-1] if lines else f"exit {r.exit_code}"]))
        return format_result(out)

    async def _grade(self, code: str) -> float:
        tests = self._task.meta["tests"]
        self._info.update(tests_total=len(tests), tests_passed=0)
        if len(code) > self.config.max_code_chars:
            self._info["sandbox_status"] = "rejected"
            return 0.0
        nonce = secrets.token_hex(16)
        spec = {"func": self._task.meta.get("func", FUNC), "args": [t["args"] for t in tests]}
        r = await self._sandbox(HARNESS, nonce + "\n", {"solution.py": code, "tests.json": json.dumps(spec)})
        self._info["sandbox_status"] = r.status
        if r.status != "ok":  # timeout, killed, output flood: no credit at all
            return 0.0
        passed, problem = score_harness_output(r.stdout, nonce, [t["expected"] for t in tests])
        if problem:
            self._info["harness_error"] = problem
        self._info["tests_passed"] = passed
        return passed / len(tests) if tests else 0.0


def score_harness_output(stdout: str, nonce: str, expected: list) -> tuple[int, str]:
    """(tests passed, problem or ""). Anything unexpected scores 0: a duplicate or
    unknown line can only come from code that found the nonce."""
    results: dict[int, Any] = {}
    done = False
    for line in stdout.splitlines():
        if not line.startswith(nonce):
            return 0, "untagged output"
        try:
            msg = json.loads(line[len(nonce) :])
        except ValueError:
            return 0, "bad harness line"
        if not isinstance(msg, dict):
            return 0, "bad harness line"
        if "load_error" in msg:
            return 0, f"load error {str(msg['load_error'])[:40]}"
        if "done" in msg and not done and msg["done"] == len(expected):
            done = True
            continue
        i = msg.get("i")
        if type(i) is not int or not 0 <= i < len(expected) or i in results or done:
            return 0, "forged or duplicate result"
        results[i] = msg.get("out", _MISSING) if "error" not in msg else _MISSING
    if not done:
        return 0, "harness did not finish"
    return sum(_same(results.get(i, _MISSING), e) for i, e in enumerate(expected)), ""


_MISSING = object()


def _same(got: Any, want: Any) -> bool:
    # Compare canonical JSON: True != 1, 1 != 1.0, and no user-defined __eq__ reaches here.
    canon = lambda v: json.dumps(v, sort_keys=True)
    return got is not _MISSING and canon(got) == canon(want)


# --- Task generation -------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _Family:
    name: str
    params: tuple  # one prompt per parameter value
    prompt: str  # after "Write f(...): "; {k} is the parameter
    signature: str
    reference: str  # a one-line solution; {k} is the parameter
    fn: Callable  # fn(k, *args): the same function, trusted, on the host
    gen: Callable  # gen(rng, k) -> args tuple


def _word(rng: random.Random, alphabet: str = "abcdeiou", lo: int = 0, hi: int = 8) -> str:
    return "".join(rng.choice(alphabet) for _ in range(rng.randint(lo, hi)))


def _pal(rng: random.Random) -> str:
    w = _word(rng, "abc", 0, 4)
    return w + rng.choice(["", "a", "b"]) + w[::-1] if rng.random() < 0.5 else _word(rng, "abc")


_int = lambda rng, k: (rng.randint(-50, 50),)
_list = lambda rng, k: ([rng.randint(-20, 20) for _ in range(rng.randint(1, 6))],)
_FAMILIES = (
    _Family("add", tuple(range(1, 41)), "return x+{k}", "x", "return x+{k}", lambda k, x: x + k, _int),
    _Family("sub", tuple(range(1, 41)), "return x-{k}", "x", "return x-{k}", lambda k, x: x - k, _int),
    _Family("mul", tuple(range(2, 21)), "return x*{k}", "x", "return x*{k}", lambda k, x: x * k, _int),
    _Family(
        "mod",
        tuple(range(2, 13)),
        "return x%{k}",
        "x",
        "return x%{k}",
        lambda k, x: x % k,
        lambda rng, k: (rng.randint(0, 100),),
    ),
    _Family(
        "fizz",
        tuple(range(2, 10)),
        "'Fizz' if n%{k}==0 else str(n)",
        "n",
        "return 'Fizz' if n%{k}==0 else str(n)",
        lambda k, n: "Fizz" if n % k == 0 else str(n),
        lambda rng, k: (rng.randint(1, 30),),
    ),
    _Family(
        "count",
        tuple("abcdeiou"),
        "count '{k}' in s",
        "s",
        "return s.count('{k}')",
        lambda k, s: s.count(k),
        lambda rng, k: (_word(rng),),
    ),
    _Family(
        "times",
        (0,),
        "return a*b",
        "a,b",
        "return a*b",
        lambda k, a, b: a * b,
        lambda rng, k: (rng.randint(-12, 12), rng.randint(-12, 12)),
    ),
    _Family("reverse", (0,), "reverse s", "s", "return s[::-1]", lambda k, s: s[::-1], lambda rng, k: (_word(rng),)),
    _Family(
        "vowels",
        (0,),
        "count vowels in s",
        "s",
        "return sum(c in 'aeiou' for c in s)",
        lambda k, s: sum(c in "aeiou" for c in s),
        lambda rng, k: (_word(rng, "abeiouxyz"),),
    ),
    _Family("max", (0,), "max of list a", "a", "return max(a)", lambda k, a: max(a), _list),
    _Family("min", (0,), "min of list a", "a", "return min(a)", lambda k, a: min(a), _list),
    _Family("sum", (0,), "sum of list a", "a", "return sum(a)", lambda k, a: sum(a), _list),
    _Family(
        "palindrome",
        (0,),
        "True if s is a palindrome",
        "s",
        "return s==s[::-1]",
        lambda k, s: s == s[::-1],
        lambda rng, k: (_pal(rng),),
    ),
    _Family(
        "digits",
        (0,),
        "sum of digits of n",
        "n",
        "return sum(int(c) for c in str(n))",
        lambda k, n: sum(int(c) for c in str(n)),
        lambda rng, k: (rng.randint(0, 99999),),
    ),
)
SPLITS = ("train", "test")
TESTS_PER_TASK = 5
_TEST_PERCENT = 20


def _split_of(prompt: str) -> str:
    # Split by a stable hash of the prompt: a test prompt is never trained on, whatever seed.
    h = int.from_bytes(hashlib.sha256(prompt.encode()).digest()[:8], "big")
    return "test" if h % 100 < _TEST_PERCENT else "train"


def _prompts() -> list[tuple[str, _Family, Any]]:
    return [
        (f"Write {FUNC}({fam.signature}): {fam.prompt.format(k=k)}. ", fam, k) for fam in _FAMILIES for k in fam.params
    ]


def generate_tasks(seed: int, n: int, split: str = "train") -> list[Task]:
    """`n` distinct tasks, deterministic per (seed, split). Each split has a fixed pool of
    prompts; past the pool, prompts repeat with fresh hidden-test inputs."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise ValueError(f"n must be an int >= 0, got {n!r}")
    pool = [p for p in _prompts() if _split_of(p[0]) == split]
    random.Random(f"code:{seed}:{split}").shuffle(pool)
    tasks = []
    for j in range(n):
        prompt, fam, k = pool[j % len(pool)]
        rng = random.Random(f"code-tests:{seed}:{split}:{j // len(pool)}:{prompt}")
        args = [list(fam.gen(rng, k)) for _ in range(TESTS_PER_TASK)]
        tests = [{"args": a, "expected": fam.fn(k, *a)} for a in args]
        ref = f"def {FUNC}({fam.signature}): {fam.reference.format(k=k)}"
        digest = hashlib.sha256(json.dumps([prompt, tests]).encode()).hexdigest()[:12]
        tasks.append(
            Task(
                task_id=f"code-{split}-{digest}",
                prompt=prompt,
                target=ref,
                meta={"family": fam.name, "func": FUNC, "reference": ref, "tests": tests},
            )
        )
    return tasks


def oracle_action(task: Task, observations: list[str]) -> str:
    """The scripted expert: run the reference on the first hidden input, then submit it."""
    ref = task.meta["reference"]
    if not observations:
        args = ",".join(repr(a) for a in task.meta["tests"][0]["args"])
        return f"<call {TOOL_NAME}>{ref}\nprint({FUNC}({args}))</call>"
    return f"<answer>{ref}</answer>"
