"""Stage `eval`: batched rollouts of one policy on held-out splits; metrics with 95% CIs.

    python scripts/evaluate.py [eval.policy=PATH eval.tag=NAME eval.splits=[seen]]   (make eval)

Episodes are appended to runs/<run>/eval/<tag>/<split>/episodes.jsonl as they finish; an
interrupted evaluation resumes where it stopped (episodes already recorded are kept).
"""

from __future__ import annotations

import json
from pathlib import Path

import hydra
from rich.console import Console

from eto_train.envs import make_env
from eto_train.evaluation import evaluate, metrics_table
from eto_train.model.load import is_local, load_model, load_tokenizer, policy_ref
from eto_train.prompting import PromptConfig
from eto_train.records import episode_key
from eto_train.rollout import GenerationConfig, Policy, RolloutConfig, run_rollouts
from eto_train.stage import Stage, setup_runtime, to_plain
from eto_train.store import append_episodes, drop_partial_tail, read_episodes, write_json


@hydra.main(config_path="../configs", config_name="config", version_base="1.3")
def main(cfg) -> None:
    console = Console()
    setup_runtime(cfg.runtime.rollout_threads)
    env_cfg, prompt = to_plain(cfg.env), PromptConfig(**to_plain(cfg.prompt))
    ev = cfg.eval
    ref = policy_ref(ev.policy, name=ev.tag)
    tokenizer = load_tokenizer(ev.policy, trust_remote_code=cfg.trust_remote_code)
    model = load_model(ev.policy, dtype=cfg.model.dtype, trust_remote_code=cfg.trust_remote_code)
    policy = Policy(model, tokenizer, GenerationConfig(**to_plain(ev.generation)), cfg.model.max_context)
    rcfg = RolloutConfig(batch_size=ev.batch_size, env_retries=ev.env_retries, seed=cfg.seed)
    results = {}
    for split in ev.splits:
        out = Path(cfg.paths.run) / "eval" / ev.tag / split
        stage = Stage(f"eval/{ev.tag}/{split}", out,
                      {"eval": to_plain(ev), "env": env_cfg, "prompt": to_plain(cfg.prompt), "seed": cfg.seed,
                       "split": split}, inputs={"policy": ev.policy} if is_local(ev.policy) else {})
        if stage.done():
            results[split] = json.loads((out / "metrics.json").read_text())
            continue
        file = out / "episodes.jsonl"
        if not stage.begin():
            file.unlink(missing_ok=True)  # results of another config or policy: start clean
        lister = make_env(env_cfg)
        tasks = lister.tasks(split)
        lister.close()
        drop_partial_tail(file)  # a killed writer's half line must not merge with new appends
        seen = {e.episode_id for e in read_episodes(file)} if file.exists() else set()
        work = [(t, 0) for t in tasks if episode_key(ref.id, t.task_id, 0, cfg.seed) not in seen]
        if seen:
            console.print(f"[eval] {split}: resuming, {len(seen)} episodes already recorded, {len(work)} to go")
        with console.status(f"[eval] {ev.tag} on {split}: {len(work)} episodes, batch {ev.batch_size}"):
            run_rollouts(work, lambda: make_env(env_cfg), policy, ref, prompt, rcfg,
                         on_episode=lambda ep, f=file: append_episodes(f, [ep]))
        episodes = read_episodes(file)
        results[split] = evaluate(episodes)
        results[split]["policy"] = ref.id
        write_json(out / "metrics.json", results[split])
        stage.finish(results[split]["overall"], policy=ref.id)
    console.print(metrics_table(f"{ev.tag} ({ref.id})", results))


if __name__ == "__main__":
    main()
