"""Stage `experts`: play the gold path of every training task; write expert episode records.

    python scripts/experts.py [overrides]      (make experts)
"""

from __future__ import annotations

import hydra
from rich.console import Console
from rich.progress import Progress

from eto_train.envs import make_env
from eto_train.experts import expert_episode
from eto_train.prompting import PromptConfig
from eto_train.stage import Stage, to_plain
from eto_train.store import write_atomic

import json


@hydra.main(config_path="../configs", config_name="config", version_base="1.3")
def main(cfg) -> None:
    console = Console()
    env_cfg, prompt = to_plain(cfg.env), PromptConfig(**to_plain(cfg.prompt))
    out = cfg.paths.experts
    stage = Stage("experts", out.rsplit("/", 1)[0], {"env": env_cfg, "prompt": to_plain(cfg.prompt)})
    if stage.done():
        return
    env = make_env(env_cfg)
    try:
        tasks = env.tasks("train")
        episodes = []
        with Progress(console=console) as bar:
            job = bar.add_task("expert trajectories", total=len(tasks))
            for task in tasks:
                episodes.append(expert_episode(env, task, prompt))
                bar.advance(job)
    finally:
        env.close()
    lost = [e.task_id for e in episodes if not e.success]
    write_atomic(out, "".join(json.dumps(e.to_dict(), sort_keys=True) + "\n" for e in episodes))
    steps = [e.num_steps for e in episodes]
    metrics = {"episodes": len(episodes), "gold_wins": len(episodes) - len(lost), "gold_not_won": lost[:20],
               "mean_steps": sum(steps) / len(steps), "max_steps": max(steps)}
    stage.finish(metrics, output=out)
    console.print(f"[experts] {len(episodes)} expert episodes -> {out} "
                  f"(gold paths won: {metrics['gold_wins']}, mean steps {metrics['mean_steps']:.1f})")


if __name__ == "__main__":
    main()
