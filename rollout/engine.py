"""The inference engine: continuous batching of many concurrent episodes on S slots.

Episodes are coroutines. Each turn, an episode calls `await engine.generate(seq, ...)`;
the engine gives it a KV-cache slot, catches the slot up on tokens the cache has not
seen (prompt, environment output) in chunks, then decodes until the turn ends, and frees
the slot. While an episode waits on its tool, its slot decodes for others. A freed slot
remembers whose tokens it caches, so an episode that comes back to an untouched slot only
feeds what is new; one that lost its slot re-feeds its history.

All slots advance together in fixed-shape calls, so nothing recompiles. A decode call
runs up to the sampler's `decode_steps` (K) tokens per slot on the device, and ends early
once any slot ends its turn (its budget, or a stop sequence of the chat format), so the
host can hand its slot out; new episodes wait for the call, at most K steps. While some
slot still catches up, a decode call runs one step, so prompts are not held back. The
host stays the judge of a turn's end: it takes the tokens one by one with the episode's
own `stop()` and drops what a slot sampled past it (counted: `surplus_tokens`). The policy
can be swapped between calls (`policy_source`); each token records the version that
sampled it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import time
from collections.abc import Callable

import numpy as np

from core.policy.sampling import decode_loop
from core.policy.sampling.sampler import Sampler
from core.policy.text.chat_format import ChatFormat, chat_format_for
from core.policy.text.tokenizer import BYTE_TOKENIZER

# A fresh sequence copies a cached prefix of at least this many tokens from another slot
# rather than feeding it (shorter ones are not worth a row copy).
MIN_SHARED_PREFIX = 32
_WAIT = "wait"


@dataclasses.dataclass(eq=False)
class Sequence:
    """One episode's tokens, as the policy sees them."""

    tokens: list
    loss_mask: list
    logprobs: list
    versions: list
    slot: int | None = None  # the slot that last cached this sequence
    cached: int = 0  # how many of `tokens` that slot holds (valid only while it still owns it)
    done: bool = False

    @classmethod
    def start(cls, tokens: list[int]) -> Sequence:
        return cls(list(tokens), [0] * len(tokens), [0.0] * len(tokens), [-1] * len(tokens))

    def extend_env(self, tokens: list[int]) -> None:
        self.tokens.extend(tokens)
        self.loss_mask.extend([0] * len(tokens))
        self.logprobs.extend([0.0] * len(tokens))
        self.versions.extend([-1] * len(tokens))


@dataclasses.dataclass(eq=False)
class _Job:
    seq: Sequence
    max_new: int
    stop: Callable[[list[int]], bool]  # called on the turn's generated tokens
    future: asyncio.Future
    new: int = 0


class InferenceEngine:
    def __init__(
        self,
        sampler: Sampler,
        policy_source: Callable[[], tuple[object, int]],
        max_tokens: int | None = None,
        chat_format: ChatFormat | None = None,
        share_prompts: bool = True,
    ):
        self.sampler = sampler
        # How episodes on this engine turn text into the model's tokens and back: the model's.
        self.chat_format = chat_format or chat_format_for(BYTE_TOKENIZER)
        # Where the device may end a turn whose stop() is the format's (the host re-checks).
        self._stops = tuple(tuple(s) for s in self.chat_format.stop_sequences())
        self.policy_source = policy_source  # () -> (params, version); cheap, called every step
        self._placed: tuple = (None, None)  # (params as the source gave them, sampler.place of them)
        self.max_tokens = min(max_tokens or sampler.length, sampler.length)
        self._owner: list[Sequence | None] = [None] * sampler.slots
        self._free: list[int] = list(range(sampler.slots))
        self._active: dict[int, _Job] = {}
        self._queue: list[_Job] = []
        self._wake: asyncio.Event | None = None
        self._loop_task: asyncio.Task | None = None
        self._clock = itertools.count()
        # A GRPO group's episodes start from one prompt: the first to arrive prefills it (the
        # leader), the others copy its cache rows once it is in (prompt tokens -> leader).
        self.share_prompts = share_prompts
        self._leaders: dict[tuple, Sequence] = {}
        self.stats = {
            "steps": 0,
            "prefill_steps": 0,
            "generated_tokens": 0,
            "fed_tokens": 0,
            "refeeds": 0,
            "busy_s": 0.0,
            "slot_steps": 0,
            "shared_prompt_tokens": 0,  # prompt tokens copied from a leader instead of fed
            "decode_calls": 0,  # device calls that decode (tokens per call: decode_tokens / decode_calls)
            "decode_device_steps": 0,  # decode steps those calls ran (at most K each)
            "decode_tokens": 0,  # tokens they sampled for slots, surplus included
            "surplus_tokens": 0,  # of those, sampled past a turn's end (the host's stop()) and dropped
        }

    async def generate(self, seq: Sequence, max_new: int, stop: Callable[[list[int]], bool]) -> int:
        """Appends up to max_new sampled tokens to seq (fewer if stop() says so or the
        sequence reaches max_tokens); returns how many were appended."""
        if len(seq.tokens) >= self.max_tokens:
            return 0
        loop = asyncio.get_running_loop()
        if self._loop_task is None or self._loop_task.done():
            self._wake = asyncio.Event()
            self._loop_task = loop.create_task(self._run())
        job = _Job(seq, max_new, stop, loop.create_future())
        self._queue.append(job)
        self._wake.set()
        return await job.future

    def _admit(self) -> None:
        copies, deferred, taken = [], [], set()
        while self._queue and self._free:
            job = self._queue.pop(0)
            seq = job.seq
            leader = self._leader(seq)
            if leader is not None and (leader.cached < len(seq.tokens) - 1 or leader.slot in taken):
                # Its prompt is being prefilled by the leader (or copied into its slot this round): wait.
                deferred.append(job)
                continue
            intact = seq.slot in self._free and self._owner[seq.slot] is seq
            donor = self._prefix_donor(seq, taken) if leader is None and not intact else None
            if donor == _WAIT:  # another slot is prefilling the prefix this one starts with
                deferred.append(job)
                continue
            if intact:
                slot = seq.slot  # its cache is intact: feed only what is new
            else:
                # Prefer slots that cache nothing worth keeping (finished or no owner).
                slot = min(self._free, key=lambda s: self._owner[s] is not None and not self._owner[s].done)
                if seq.cached:
                    self.stats["refeeds"] += 1
                seq.slot, seq.cached = slot, 0
                self._owner[slot] = seq
                if leader is not None:  # the leader's cache holds this prompt: copy it
                    copies.append((leader.slot, slot))
                    seq.cached = len(seq.tokens) - 1
                    self.stats["shared_prompt_tokens"] += seq.cached
                elif donor is not None:  # a common prefix (system turn, tools block) is cached
                    if donor[0] != slot:  # (in this slot already: nothing to copy)
                        copies.append((donor[0], slot))
                    seq.cached = donor[1]
                    self.stats["shared_prompt_tokens"] += seq.cached
            taken.add(slot)
            self._free.remove(slot)
            seq.cached = min(seq.cached, len(seq.tokens) - 1)  # re-feed the last token for its logits
            self._active[slot] = job
        self._queue[:0] = deferred
        if copies:
            self.sampler.copy_rows(copies)

    def _prefix_donor(self, seq: Sequence, taken: set[int]):
        """(slot, n): a slot whose cache holds the first n tokens of this sequence, the most
        of any, n >= MIN_SHARED_PREFIX (other tasks' episodes start with the same system turn
        and tools block: hundreds of tokens of a checkpoint's prompt); _WAIT if a slot that is
        still catching up (or handed out in this admission round, whose copy or prefill comes
        after this one's copy) will hold more of it than any does now; None if none shares."""
        if not self.share_prompts or len(seq.tokens) <= MIN_SHARED_PREFIX:
            return None
        head = seq.tokens[:MIN_SHARED_PREFIX]
        mine = np.asarray(seq.tokens[: len(seq.tokens) - 1], np.int64)  # the last is fed for its logits
        ready, pending = (None, 0), 0
        for slot, owner in enumerate(self._owner):
            if owner is None or owner is seq or owner.tokens[:MIN_SHARED_PREFIX] != head:
                continue
            n = min(len(mine), len(owner.tokens))
            same = mine[:n] == np.asarray(owner.tokens[:n], np.int64)
            common = n if same.all() else int(np.argmin(same))
            if slot in taken or (slot in self._active and owner.cached < common):
                pending = max(pending, common)
            elif min(common, owner.cached) > ready[1]:
                ready = (slot, min(common, owner.cached))
        if pending >= MIN_SHARED_PREFIX and pending > ready[1]:
            return _WAIT
        return ready if ready[1] >= MIN_SHARED_PREFIX else None

    def _leader(self, seq: Sequence) -> Sequence | None:
        """The sequence whose slot holds (or is prefilling) this fresh sequence's prompt;
        None if there is none, and then this one leads for its prompt."""
        if not self.share_prompts or seq.cached or seq.slot is not None or len(seq.tokens) < 2:
            return None
        key = tuple(seq.tokens)
        leader = self._leaders.get(key)
        if leader is not None and leader.slot is not None and self._owner[leader.slot] is leader:
            return leader
        if len(self._leaders) >= 4 * self.sampler.slots:  # forget leaders whose slots moved on
            self._leaders = {k: v for k, v in self._leaders.items() if v.slot is not None and self._owner[v.slot] is v}
        self._leaders[key] = seq
        return None

    async def _run(self) -> None:
        try:
            while True:
                self._admit()
                if not self._active:
                    self._placed = (None, None)  # idle: pin no version
                    self._wake.clear()
                    await self._wake.wait()
                    continue
                try:
                    self._step()
                except Exception as e:
                    for slot, job in list(self._active.items()):
                        self._finish(slot, job, error=e)
                await asyncio.sleep(0)  # let environments and new episodes run
        finally:
            # Cancelled with its event loop: the task and the engine form a cycle that would
            # pin the params until a full gc pass (the evaluator's next version beside them).
            self._placed = (None, None)

    def _params(self):
        """(placed params, version): put on the device and flattened once per version."""
        params, version = self.policy_source()
        if params is not self._placed[0]:
            self._placed = (params, self.sampler.place(params))
        return self._placed[1], version

    def _step(self) -> None:
        """One engine step: a catch-up call for up to `prefill_slots` slots with input
        (prompt, observation), then one decode call for every slot waiting on one token,
        those whose catch-up just ended included. Slots without input cost nothing in the
        catch-up call."""
        t0 = time.perf_counter()
        params, version = self._params()
        pending = {s: len(j.seq.tokens) - j.seq.cached for s, j in self._active.items()}
        fill = [s for s, p in pending.items() if p > 1][: self.sampler.prefill_slots]  # admission order
        if fill:
            self._take(self._catch_up(params, fill, pending), version)
        decode = [s for s, j in self._active.items() if len(j.seq.tokens) - j.seq.cached == 1]
        if decode:
            # Others still catching up: one step, or their input would wait K steps.
            steps = self.sampler.decode_steps if len(decode) == len(self._active) else 1
            self._decode(params, decode, steps, version)
        self.stats["steps"] += 1
        self.stats["prefill_steps"] += bool(fill)
        self.stats["busy_s"] += time.perf_counter() - t0

    def _start(self, s: int) -> int:
        """Where slot s's next chunk goes: after what its owner has cached."""
        owner = self._owner[s]
        return min(owner.cached, self.sampler.length - 1) if owner is not None else 0

    def _catch_up(self, params, fill: list[int], pending: dict) -> dict:
        sampler = self.sampler
        k, width = sampler.prefill_slots, sampler.prefill
        # Pad to the compiled row count with other slots, fed nothing (their junk lands past
        # their content, and a decode later in this step rewrites its own position).
        rows = fill + [s for s in range(sampler.slots) if s not in fill][: k - len(fill)]
        tokens, n_valid = np.zeros((k, width), np.int32), np.zeros(k, np.int32)
        for i, s in enumerate(fill):
            seq = self._active[s].seq
            n_valid[i] = min(pending[s], width)
            tokens[i, : n_valid[i]] = seq.tokens[seq.cached : seq.cached + n_valid[i]]
        nxt, logp = sampler.prefill_rows(
            params, np.array(rows), tokens, np.array([self._start(s) for s in rows]), n_valid
        )
        self.stats["fed_tokens"] += int(n_valid.sum())
        self.stats["slot_steps"] += k
        return {s: (int(nxt[i]), float(logp[i]), int(n_valid[i])) for i, s in enumerate(fill)}

    def _decode(self, params, decode: list[int], steps: int, version: int) -> None:
        """Up to `steps` tokens for every slot in `decode` in one device call (`step` when
        the sampler runs one step a call), taken as they come until a turn ends."""
        sampler, n, width = self.sampler, self.sampler.slots, decode_loop.STOP_LEN
        tokens, start, budget = np.zeros(n, np.int32), np.zeros(n, np.int32), np.zeros(n, np.int32)
        use_stops, recent = np.zeros(n, bool), np.full((n, width), -1, np.int32)
        for s in range(n):
            start[s] = self._start(s)
        for s in decode:
            job = self._active[s]
            seq = job.seq
            tokens[s] = seq.tokens[seq.cached]
            budget[s] = max(1, min(job.max_new - job.new, self.max_tokens - len(seq.tokens), steps))
            if budget[s] > 1 and job.stop == self.chat_format.is_turn_end:
                use_stops[s] = True
                tail = seq.tokens[len(seq.tokens) - min(job.new, width) :]
                recent[s, width - len(tail) :] = tail
        if sampler.decode_steps == 1:
            nxt, logp = sampler.step(params, tokens[:, None], start, budget)
            ids, logps, counts = nxt[:, None], logp[:, None], budget
        else:
            ids, logps, counts = sampler.decode_loop(
                params, tokens, start, budget, stop_sequences=self._stops, use_stops=use_stops, recent=recent
            )
        self.stats["decode_calls"] += 1
        self.stats["decode_device_steps"] += int(counts.max())
        self.stats["decode_tokens"] += int(counts.sum())
        self.stats["fed_tokens"] += int(counts.sum())
        self.stats["slot_steps"] += n * int(counts.max())
        for s in decode:
            self._take_decoded(s, ids[s, : counts[s]], logps[s, : counts[s]], version)

    def _take(self, results: dict, version: int) -> None:
        """Each caught-up slot's cache advanced; one whose sequence is caught up gets its token."""
        for s, (token, logp, fed) in results.items():
            seq = self._active[s].seq
            seq.cached += fed
            if seq.cached < len(seq.tokens):
                continue  # still catching up
            self._append(s, int(token), float(logp), version)

    def _take_decoded(self, s: int, ids, logps, version: int) -> None:
        """A slot's decoded tokens, each fed after the one before: taken until its turn ends."""
        seq = self._active[s].seq
        for i, (token, logp) in enumerate(zip(ids.tolist(), logps.tolist())):
            seq.cached += 1
            if self._append(s, token, logp, version):
                self.stats["surplus_tokens"] += len(ids) - i - 1  # junk past `cached`, overwritten later
                return

    def _append(self, s: int, token: int, logp: float, version: int) -> bool:
        """Appends slot s's sampled token; True when that ended the turn (the slot is freed)."""
        job = self._active[s]
        seq = job.seq
        seq.tokens.append(token)
        seq.loss_mask.append(1)
        seq.logprobs.append(logp)
        seq.versions.append(version)
        job.new += 1
        self.stats["generated_tokens"] += 1
        if (
            job.new >= job.max_new
            or len(seq.tokens) >= self.max_tokens
            or job.stop(seq.tokens[len(seq.tokens) - job.new :])
        ):
            self._finish(s, job)
            return True
        return False

    def _finish(self, slot: int, job: _Job, error: Exception | None = None) -> None:
        del self._active[slot]
        self._free.append(slot)
        if not job.future.done():
            if error is None:
                job.future.set_result(job.new)
            else:
                job.future.set_exception(error)

    def release(self, seq: Sequence) -> None:
        """The episode is over: its slot's cache is no longer worth keeping."""
        seq.done = True
