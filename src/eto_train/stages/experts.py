"""Stage `experts`: the expert trajectory of every training task, as episode records.

``experts.source``: ``gold`` plays each task's gold action path through the environment
(ScienceWorld, ALFWorld, TextWorldExpress; the trajectories carry no thoughts); a file path
imports the ETO authors' released SFT data (``<env>_sft.json``: GPT-4 written ``Thought:``
lines), each trajectory bound to the training task its id names.
"""

from __future__ import annotations

from pathlib import Path

from rich.console import Console
from rich.progress import Progress

from ..config import typed
from ..envs import make_env
from ..eto_format import import_experts
from ..experts import expert_episode
from ..manifest import Stage
from ..prompting import PromptConfig
from ..store import write_jsonl


def run(cfg) -> None:
    cfg = typed(cfg)
    console = Console(markup=False)
    env_cfg, prompt = cfg.env.plain(), PromptConfig(**cfg.prompt.plain())
    source = str(cfg.experts.source)
    out = Path(cfg.paths.experts)
    # Only what shapes the expert data: adding a held-out split does not redo it.
    # (dev_holdout shapes the training split; 0, the default, leaves the hash of earlier runs as it was)
    scope = {k: env_cfg[k] for k in env_cfg if k not in ("splits", "faults", "metric", "workers")
             and not (k == "dev_holdout" and not env_cfg[k])} | {"train_split": env_cfg["splits"]["train"]}
    if source == "gold":
        stage = Stage("experts", out.parent, {"env": scope, "prompt": cfg.prompt.plain(), "source": source},
                      outputs=[out.name])
    else:
        if not Path(source).is_file():
            raise FileNotFoundError(f"experts.source: {source}: no such file (the authors' <env>_sft.json, or 'gold')")
        # imported trajectories keep their own prompt: the prompt profile does not shape them
        stage = Stage("experts", out.parent, {"env": scope, "source": source}, inputs={"source": source},
                      outputs=[out.name])
    if stage.done():
        return
    env = make_env(env_cfg)
    try:
        if source != "gold":  # read and check the whole file before anything is written
            episodes, report = import_experts(source, env.tasks("train"), env.version)
        stage.begin()
        if source == "gold":
            episodes = _play_gold(env, prompt, console)
    finally:
        env.close()
    # a rerun of a finished stage (other config, or its file found damaged) writes aside, swapped in at finish
    write_jsonl(stage.work / out.name, (e.to_dict() for e in episodes))
    steps = [e.num_steps for e in episodes]
    if source == "gold":
        lost = [e.task_id for e in episodes if not e.success]
        metrics = {"episodes": len(episodes), "gold_wins": len(episodes) - len(lost), "gold_not_won": lost[:20]}
        what = f"gold paths won: {metrics['gold_wins']}"
    else:
        metrics = {"episodes": len(episodes), **report}
        what = (f"imported {report['imported']} of {report['entries']} from {source}; "
                f"{report['unmatched']} match no training task {report['unmatched_ids'][:3]}, "
                f"{report['duplicates']} duplicates, {report['tasks_without_expert']} tasks without an expert")
    metrics |= {"mean_steps": sum(steps) / len(steps), "max_steps": max(steps)}
    stage.finish(metrics, output=str(out))
    console.print(f"[experts] {len(episodes)} expert episodes -> {out} ({what}, mean steps {metrics['mean_steps']:.1f})")


def _play_gold(env, prompt: PromptConfig, console: Console) -> list:
    tasks = env.tasks("train")
    episodes = []
    with Progress(console=console) as bar:
        job = bar.add_task("expert trajectories", total=len(tasks))
        for task in tasks:
            episodes.append(expert_episode(env, task, prompt))
            bar.advance(job)
    return episodes
