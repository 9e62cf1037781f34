"""ScienceWorld's gold paths measured in the real model's tokens, per task type (issue 55).

For each of ETO's 24 task types, the first ``--per-type`` variations of ETO's train list (the order of
train_indices.json) are played along their gold paths (``generateGoldPath``, as ``eto-train experts`` plays them),
with the action-only prompt (``--prompt``, default sciworld_eto_actions). For each demonstration:

- ``steps``: the gold path's length, beside the task type's step limit (max_steps.json);
- ``bc_tokens``: the conversation BC trains on (opening, task, the gold exchanges; no example), in tokens of the
  real model's chat template (``records.to_messages``, ``prompting.chat_ids``);
- ``rollout_tokens``: the longest prompt a policy meets when it plays the same path (opening, the one-shot example,
  task, every exchange but the last answer) plus that answer;
- ``per_exchange``: tokens of one (answer, observation) exchange on average, and from it ``at_limit``: the
  rollout prompt of an episode that plays all of the task's step limit with exchanges of that size (what a
  policy that never wins costs).

  .venv/bin/python lab/sciworld_lengths.py --per-type 6 --out runs/sciworld_lengths/lengths.json

Prints one row per task type (means, maxima) and writes every demonstration's numbers to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--per-type", type=int, default=6, help="train variations per task type (first in ETO's list)")
    ap.add_argument("--tasks", nargs="*", default=None, help="ETO task names (default: all 24 of the splits)")
    ap.add_argument("--prompt", default="sciworld_eto_actions")
    ap.add_argument("--model", default=str(ROOT / "models/smollm2-135m-instruct"))
    ap.add_argument("--out", default=str(ROOT / "runs/sciworld_lengths/lengths.json"))
    args = ap.parse_args()

    from omegaconf import OmegaConf
    from transformers import AutoTokenizer

    from eto_train.envs.scienceworld import ScienceWorldEnv
    from eto_train.experts import expert_episode
    from eto_train.prompting import PromptConfig, chat_ids, rollout_context
    from eto_train.records import to_messages

    prompt = PromptConfig(**OmegaConf.to_container(OmegaConf.load(ROOT / "configs/prompt" / f"{args.prompt}.yaml")))
    tok = AutoTokenizer.from_pretrained(args.model)
    env_cfg = OmegaConf.to_container(OmegaConf.load(ROOT / "configs/env/sciworld.yaml"))
    env_cfg.update(tasks=args.tasks, limit_per_task=args.per_type, data_dir=str(ROOT / "data/sciworld_eto"))
    env = ScienceWorldEnv(**env_cfg)
    limits = env.limits
    rows, t0 = [], time.monotonic()
    try:
        for task in env.tasks("train"):
            t = time.monotonic()
            ep = expert_episode(env, task, prompt)
            msgs = to_messages(ep)
            bc = len(chat_ids(tok, msgs, add_generation_prompt=False))
            head = rollout_context(prompt, ep.system, ep.first_user)
            last_prompt = head + msgs[len(msgs) - 2 * len(ep.steps) + 1:-1]  # every exchange but the last answer
            rollout = len(chat_ids(tok, last_prompt)) + len(tok(msgs[-1]["content"], add_special_tokens=False)["input_ids"]) + 1
            prefix = len(chat_ids(tok, head))
            per_exchange = (rollout - prefix) / max(1, len(ep.steps))
            rows.append({"task": task.game, "variation": task.seed, "steps": len(ep.steps), "won": ep.success,
                         "limit": limits.get(task.game), "bc_tokens": bc, "rollout_tokens": rollout,
                         "prefix_tokens": prefix, "per_exchange": per_exchange,
                         "at_limit": prefix + per_exchange * limits.get(task.game, 100),
                         "seconds": time.monotonic() - t})
            print(f"{task.game} {task.seed}: {len(ep.steps)} steps, won {ep.success}, bc {bc}, rollout {rollout} "
                  f"tokens ({time.monotonic() - t:.1f} s)", flush=True)
    finally:
        env.close()
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"prompt": args.prompt, "per_type": args.per_type, "seconds": time.monotonic() - t0,
                               "rows": rows}, indent=1))
    print(f"\n| task | limit | n | won | gold steps mean/max | BC tokens mean/max | rollout tokens mean/max | "
          f"tokens/exchange | at limit |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for game in sorted({r["task"] for r in rows}, key=lambda g: (limits.get(g, 100), g)):
        rs = [r for r in rows if r["task"] == game]

        def mm(key: str) -> str:
            xs = [r[key] for r in rs]
            return f"{statistics.mean(xs):.0f} / {max(xs):.0f}"
        print(f"| {game} | {limits.get(game)} | {len(rs)} | {sum(r['won'] for r in rs)} | {mm('steps')} | "
              f"{mm('bc_tokens')} | {mm('rollout_tokens')} | {statistics.mean(r['per_exchange'] for r in rs):.0f} | "
              f"{statistics.mean(r['at_limit'] for r in rs):.0f} |")
    print(f"-> {out} ({time.monotonic() - t0:.0f} s)")


if __name__ == "__main__":
    main()
