"""Stage `experts`: play the gold path of every training task; write expert episode records."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console
from rich.progress import Progress

from ..envs import make_env
from ..experts import expert_episode
from ..prompting import PromptConfig
from ..stage import Stage, to_plain
from ..store import write_jsonl


def run(cfg) -> None:
    console = Console(markup=False)
    env_cfg, prompt = to_plain(cfg.env), PromptConfig(**to_plain(cfg.prompt))
    out = Path(cfg.paths.experts)
    # Only what shapes the expert data: adding a held-out split does not redo it.
    scope = {k: env_cfg[k] for k in env_cfg if k not in ("splits", "faults")} | {"train_split": env_cfg["splits"]["train"]}
    stage = Stage("experts", out.parent, {"env": scope, "prompt": to_plain(cfg.prompt)})
    if stage.done():
        return
    stage.begin()
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
    write_jsonl(out, (e.to_dict() for e in episodes))
    steps = [e.num_steps for e in episodes]
    metrics = {"episodes": len(episodes), "gold_wins": len(episodes) - len(lost), "gold_not_won": lost[:20],
               "mean_steps": sum(steps) / len(steps), "max_steps": max(steps)}
    stage.finish(metrics, output=str(out))
    console.print(f"[experts] {len(episodes)} expert episodes -> {out} "
                  f"(gold paths won: {metrics['gold_wins']}, mean steps {metrics['mean_steps']:.1f})")
