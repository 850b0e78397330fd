"""A trained version, exported, against `transformers`: greedy ids on held-out prompts.

    .venv/bin/python benchmarks/export_check.py --store WORKDIR/policy-store [--version V] [--n 20]

Exports the version with `agentic-rl export`, loads the directory with
`transformers.AutoModelForCausalLM` (CPU torch), and for `--n` held-out tasks of `--env`
(each rendered as an episode's first turn: the system turn with the tools block, the task)
compares `generate(do_sample=False)` with `agentic-rl generate --greedy` on the same
directory: the prompt ids and every generated id must be equal. Prints one row per prompt;
exits 1 if any differs. The check docs/MODELS.md cites for a real model's export.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--store", required=True)
    p.add_argument("--version", type=int, default=None)
    p.add_argument("--n", type=int, default=20)
    p.add_argument("--env", default="calculator")
    p.add_argument("--max_new_tokens", type=int, default=48)
    p.add_argument("--json", default=None, help="also write the rows here")
    a = p.parse_args(argv)

    import torch
    import transformers

    import environments
    from agentic_rl import export, generate
    from core import config
    from core.policy.sources import load_policy
    from core.policy.text.chat_format import chat_format_for

    torch.set_num_threads(os.cpu_count() or 1)
    with tempfile.TemporaryDirectory() as tmp:
        argv_export = [f"--store={a.store}", f"--out={tmp}/exported"]
        if a.version is not None:
            argv_export.append(f"--version={a.version}")
        done = export.run(config.parse(export.ExportConfig, argv_export))
        out = done["out"]
        print(f"exported version {done['version']} of {a.store} to {out}")
        hf = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
        hf_tok = transformers.AutoTokenizer.from_pretrained(out)
        fmt = chat_format_for(load_policy(out).tokenizer)
        env = environments.make(a.env)
        tools = env.tools()
        rows = []
        for i, task in enumerate(environments.make_tasks(a.env, 0, a.n, "test")):
            messages = fmt.prompt_messages(task.prompt, tools)
            chat = os.path.join(tmp, f"chat{i}.json")
            with open(chat, "w") as f:
                json.dump({"messages": messages, "tools": fmt.style.template_tools(tools)}, f)
            t0 = time.monotonic()
            ours = generate.run(
                config.parse(
                    generate.GenerateConfig,
                    [f"--model={out}", f"--messages={chat}", "--greedy", f"--max_new_tokens={a.max_new_tokens}"],
                )
            )
            t_ours = time.monotonic() - t0
            prompt = hf_tok.apply_chat_template(
                messages, tools=fmt.style.template_tools(tools), add_generation_prompt=True, tokenize=True
            )
            prompt = list(prompt["input_ids"] if hasattr(prompt, "keys") else prompt)  # a BatchEncoding or ids
            t0 = time.monotonic()
            with torch.no_grad():
                gen = hf.generate(
                    torch.tensor([prompt]),
                    do_sample=False,
                    max_new_tokens=a.max_new_tokens,
                    eos_token_id=list(fmt.tokenizer.eos_ids),
                    pad_token_id=fmt.tokenizer.eos_ids[0],
                )
            t_hf = time.monotonic() - t0
            theirs = gen[0, len(prompt) :].tolist()
            row = {
                "task": task.prompt,
                "prompt_equal": prompt == ours["prompt_ids"],
                "ids_equal": theirs == ours["ids"],
                "new_tokens": len(ours["ids"]),
                "text": ours["text"],
                "ours_s": round(t_ours, 2),
                "hf_s": round(t_hf, 2),
            }
            rows.append(row)
            print(
                f"{i:>3} prompt {'=' if row['prompt_equal'] else 'DIFFERS'} ids {'=' if row['ids_equal'] else 'DIFFER'}"
                f" {row['new_tokens']:>3} tokens  {row['text'][:60]!r}",
                flush=True,
            )
    equal = sum(r["prompt_equal"] and r["ids_equal"] for r in rows)
    print(f"greedy ids equal on {equal} of {len(rows)} held-out prompts (version {done['version']})")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"version": done["version"], "store": a.store, "equal": equal, "rows": rows}, f, indent=1)
    return 0 if equal == len(rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
