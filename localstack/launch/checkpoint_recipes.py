"""The recipe for a pretrained checkpoint (`--model DIR`), on top of the environment's.

The environment recipes (recipes.py) are the built-in byte policy's: a random 0.14 M
model that needs thousands of behaviour-cloning steps at 3e-3 before RL has a signal. A
pretrained instruct model reads the system prompt and writes language; what it lacks is
the tool-call syntax and when to call. And it has about 1,000 times the byte model's
parameters: on this 2-core machine it trains ~105 tokens/s alone, so every setting here
spends tokens carefully.
Measured on SmolLM2-135M-Instruct (`make real-model`; docs/RESULTS.md, "A real model",
has the runs and the commands):

- Turn length 48: the longest oracle action in SmolLM2's format (a Hermes `<tool_call>`
  block with a nested expression, end of turn included) is 34 tokens; the byte policy's 32
  cut it.
- Warm start: zero-shot the model solves 0 of 64 held-out tasks, sampled or greedy (it
  answers in prose or writes calls that are not JSON), so RL alone has no signal. 12 steps
  of 4 demonstrations in its own chat format at 3e-4 (4 warmup steps, cosine): 2.3 minutes
  of the hour. Held-out sampled v0 by warm-start length (one run each): 12 steps 0.344
  (run 9; greedy 0.980: it knows the call, and skips it in 145 of 256 sampled episodes,
  which RL fixes: 0.922 at v2), 20 steps 0.629 (run 8), 28 steps 0.676 (run 7): only 12
  leaves the 0.6 asked. Runs 1-6 (28-48 steps: v0 0.367-0.707) warm-started on misaligned
  rows, a bug since fixed. The demonstrations call the tool once with the whole expression
  (the calculator's BY_ENV below); a fifth of them answer at once, the decision RL keeps.
  With half answering at once the model called well but did not answer with the result
  (v0 held-out sampled 0.016-0.031 in probes): it needs the copy demonstrated more often
  than the decision. The byte recipe's 3e-3 made the loss rise (6.07 -> 7.59 in 2 steps).
- RL: full fine-tuning (memory does not bind: the learner peaked at 10.8-13.1 GB of 24); 2
  records a step (the demo's layout holds one group of 8 a record, rows of 960 x 3 for
  this model: 5,760 tokens a step, 2.0-3.3 minutes of compute beside rollout and evaluation,
  1.2-1.8 with no evaluator running), records waiting up to 30 s to fill (a group reaches
  the packer minutes after the last), a version every step; runs 1-14 at 5e-5. 10 steps:
  run 2 reached +0.2 at v4 and 0.996 at v12, and took 62.7 minutes with 12; run 4 (32
  warm-start steps) 0.621 -> 0.992 at v10 in 44.0 minutes; run 7 (28 steps) 0.676 ->
  0.988 at v5 and 0.938 at v10 in 41.9 minutes; run 9 (this warm start) 0.344 -> 0.977 at v7,
  then malformed calls: 0.680 at v10, in 38.2 minutes. The constant rate lets a nearly
  deterministic policy take a bad late step (runs 6 and 9), so the rate now falls by a
  cosine to a tenth at the last step (`--learner.lr_decay=0.9`, as code's and guess's byte
  recipes: code's last versions steadied with it). Run 10 held 0.941-0.949 from v6 to
  v10; run 11, the same recipe, collapsed by v7 (empty answers, broken calls) and its
  learner starved: decay shrinks the late steps, it does not prevent an early collapse.
  At 5e-5 the first RL step took the entropy from 0.22-0.30 to 0.03-0.04 (runs 9, 13,
  14): a policy that near-deterministic goes a long way on one bad batch. So the rate is
  2e-5: entropy 0.22 -> 0.08 after the first step; 0.344 -> 0.930 at v10 (run 15), 0.906
  (run 16, 0.965 at v9) and 0.953 (run 17), none with a collapse.
  A KL to v0 was tried and left out (`--learner.kl_coef=0.1`, runs 13-14): estimated
  unweighted on the sampler's tokens it charged 12-49 nats a token and set the steps
  (run 13: 0.863 at v2, 0.613 at v8, 0.719 at v10); weighted by pi/mu
  (losses.reference_kl) it still let answers without a call come back (run 14: 0.910 at
  v4, 0.656 at v6, 0.891 at v10). v0 skips the call in 145 of 256 episodes, so a pull
  towards v0 works against what RL must learn (a reading, not a measured cause); and the
  reference's forward pass took the demo past the hour (62.1 minutes in run 14).
  The evaluator at nice 10 scores greedy only at v0 and the final version
  (`--eval_greedy_at=ends`), which cost run 2 three minutes at its end.
- Episode timeouts of 15 minutes, and requests written off after 30: 64 episodes share one
  engine on a core, and a real model's turn takes seconds; the byte policy's 120 s cut
  episodes by wall clock, not behaviour (45 of 64 held-out episodes "timed out" in a probe).
  Catch-up chunks of 32 tokens: the prompts are hundreds of tokens.
- The planner is off: at this size its measurements (a learner step, the rollout rate)
  take minutes of the hour. The credit window is the feeder's default, one batch ahead.
"""

from __future__ import annotations

# Settings every checkpoint gets, whatever its environment.
COMMON: tuple[str, ...] = (
    "--max_new_tokens_per_turn=48",
    "--warmstart_steps=12",
    "--warmstart_batch=4",
    "--warmstart_tasks=400",
    "--warmstart_direct_frac=0.2",
    "--warmstart_lr=3e-4",
    "--warmstart_warmup=4",
    "--batch_records=2",
    "--publish_every=1",
    "--max_steps=10",
    "--learner.learning_rate=2e-5",
    "--learner.lr_warmup_steps=0",
    "--learner.lr_decay=0.9",
    "--timeout_s=5400",
    "--plan=off",
    "--rollout.episode_timeout_s=900",
    "--rollout.engine_prefill=32",
    "--learner.request_timeout_s=1800",
    "--eval_episode_timeout_s=900",
    "--max_wait_s=30",
    "--eval_nice=10",
    "--eval_greedy_at=ends",
    # pass@1..4 at v0 and the final version, and v0 at T = 0.2, 0.5, 0.8: 64 tasks x 4
    # samples cost what 256 x 1 did (5-7 minutes a mode at this size); the versions between
    # score 64 x 1.
    "--eval_n=64",
    "--eval_samples=4",
    # The learner within 6 GB: remat on, the step's working memory by XLA's analysis at
    # 6 x 960 is 1.66 GB in 6 micro-batches against 4.71 GB with remat off (the layout
    # `auto` picks when 22 GB are free), which took the learner to 9.5 GB (issue 55). 2.0,
    # not 1.7: the chained game's rows of 1,408 need 1.7x GB (refused at 1.7).
    "--learner.step_memory_gb=2.0",
)

# What an environment's checkpoint recipe changes on top of COMMON.
BY_ENV: dict[str, tuple[str, ...]] = {
    # One call with the whole expression, then its result (the tool takes up to two
    # operations a call: every task's). Demonstrations chaining one call per operation
    # left the model calling on after the answer was in (v0 0.031 after 24 steps of 8 and
    # after 48 of 4: 36 of 64 episodes truncated in calls).
    "calculator": ('--env_config={"max_ops_per_call": 2}', "--warmstart_oracle=whole"),
    # The chained game (environments/calculator.py: one operation a call, 2-3 a task, each
    # result fed back), made so that the warm-started model does not already know it: greedy
    # v0 must stay low, and RL must find the rest. A quarter of the demonstrations answer the
    # task's result after a random number of the calls (any_turn), which teaches that
    # stopping is allowed, not when; the model cannot do 2-3 operations in its head, so
    # stopping early mostly fails, and the reward tells a finished chain from a cut one.
    # Measured (docs/RESULTS.md, issue 55): 12 steps with half stopping early left sampled
    # success near 0.02 (10 of 12 groups all-zero; the learner stopped, starved, before step
    # 1); 24 steps with a quarter gave v0 pass@1 0.164, pass@4 0.422, and 5 of 6 groups with
    # signal. Records come slowly while few groups carry signal: the learner waits up to 15
    # minutes before it calls the run starved. (Demonstrations that always chain left the
    # model calling on after the answer was in: v0 0.031, runs before issue 55.)
    "calculator_chained": (
        "--warmstart_steps=24",
        "--warmstart_direct_frac=0.25",
        "--warmstart_direct_at=any_turn",
        "--learner.starved_stop_s=900",
    ),
}


def checkpoint_recipe(env: str) -> tuple[str, ...]:
    """The flags a checkpoint's run of `env` starts from (any flag given overrides them)."""
    return (*COMMON, *BY_ENV.get(env, ()))
