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

from ..config import Config, require
from ..envs import make_env, registry
from ..eto_format import import_experts
from ..experts import expert_episode
from ..manifest import Stage
from ..prompting import PromptConfig
from ..store import write_jsonl

LOST_SHOWN = 5  # task ids a warning about gold paths that lost names


def run(cfg: Config) -> None:
    require(cfg, "eto_train.stages.experts.run")
    console = Console(markup=False)
    env_cfg, prompt = cfg.env.plain(), PromptConfig(**cfg.prompt.plain())
    source = str(cfg.experts.source)
    out = Path(cfg.paths.experts)
    # Only what shapes the expert data: adding a held-out split does not redo it.
    # (dev_holdout shapes the training split; 0, the default, leaves the hash of earlier runs as it was)
    scope = {k: env_cfg[k] for k in env_cfg if k not in registry.NOT_HASHED
             or (k == "dev_holdout" and env_cfg[k])} | {"train_split": env_cfg["splits"]["train"]}
    if source != "gold" and not Path(source).is_file():
        raise FileNotFoundError(f"experts.source: {source}: no such file (the authors' <env>_sft.json, or 'gold')")
    env = make_env(env_cfg)  # its adapter and version are part of the stage's identity
    stage = None
    try:
        identity = registry.identity(env_cfg, env)
        if source == "gold":
            stage = Stage("experts", out.parent, {"env": scope, "prompt": cfg.prompt.plain(), "source": source},
                          outputs=[out.name], environment=identity)
        else:  # imported trajectories keep their own prompt: the prompt profile does not shape them
            stage = Stage("experts", out.parent, {"env": scope, "source": source}, inputs={"source": source},
                          outputs=[out.name], environment=identity)
        if stage.done():
            return
        if source != "gold":  # read and check the whole file before anything is written
            episodes, report = import_experts(source, env.tasks("train"), env.version,
                                              other_splits=lambda: _other_splits(env, env_cfg))
        stage.begin()
        if source == "gold":
            episodes = _play_gold(env, prompt, console)
            lost = [e for e in episodes if not e.success]
            if lost:
                _lost(lost, len(episodes), out, cfg.experts.on_lost, console)
    except BaseException:
        if stage is not None:
            stage.release()  # a refused file: the lock file goes now, so a failed start leaves no folder behind
        raise
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
        elsewhere = "".join(f", {n} of them tasks of split {label}" for label, n in report["unmatched_in_splits"].items())
        what = (f"imported {report['imported']} of {report['entries']} from {source}; "
                f"{report['unmatched']} match no training task {report['unmatched_ids'][:3]}{elsewhere}, "
                f"{report['duplicates']} duplicates, {report['tasks_without_expert']} tasks without an expert")
    metrics |= {"mean_steps": sum(steps) / len(steps), "max_steps": max(steps)}
    stage.finish(metrics, output=str(out))
    console.print(f"[experts] {len(episodes)} expert episodes -> {out} ({what}, mean steps {metrics['mean_steps']:.1f})")


def _other_splits(env, env_cfg: dict) -> dict[str, list]:
    """The environment's tasks of every split but train, by a label naming the split and, where the
    config names one, its list (``'unseen' (test_indices.json)``): an imported file's other tasks."""
    out = {}
    for name, spec in (env_cfg.get("splits") or {}).items():
        if name == "train":
            continue
        label = repr(name) + (f" ({spec})" if isinstance(spec, str) else "")
        try:
            out[label] = env.tasks(name)
        except Exception:  # noqa: BLE001 - a split that cannot be listed is just not named
            continue
    if "dev" not in (env_cfg.get("splits") or {}) and env_cfg.get("dev_holdout"):
        try:
            out["'dev' (held out of the training list, env.dev_holdout)"] = env.tasks("dev")
        except Exception:  # noqa: BLE001
            pass
    return out


class LostExperts(ValueError):
    """Gold paths that do not win in the environment, with ``experts.on_lost=error``."""


def _lost(lost: list, total: int, out: Path, on_lost: str, console: Console) -> None:
    """Name the gold paths that did not win (count, first task ids and how each ended, the file):
    a warning, or with ``experts.on_lost=error`` an error before the file is written."""
    shown = ", ".join(f"{e.task_id} ({e.status}, score {e.final_score:g})" for e in lost[:LOST_SHOWN])
    more = f" and {len(lost) - LOST_SHOWN} more" if len(lost) > LOST_SHOWN else ""
    what = (f"{len(lost)} of {total} gold paths did not win in the environment: {shown}{more}. BC clones and pairs "
            f"contrast only the gold paths that won")
    if on_lost == "error":
        raise LostExperts(f"{what}; experts.on_lost=error, so {out} was not written. Check the adapter's "
                          f"expert_actions and its success flag, or set experts.on_lost=warn to keep the winners")
    if len(lost) == total:
        what += " (none did: bc will have nothing to clone)"
    console.print(f"[experts] warning: {what}; the file keeps all of them: {out} (experts.on_lost=error makes this "
                  f"an error)", soft_wrap=True)


def _play_gold(env, prompt: PromptConfig, console: Console) -> list:
    tasks = env.tasks("train")
    episodes = []
    with Progress(console=console) as bar:
        job = bar.add_task("expert trajectories", total=len(tasks))
        for task in tasks:
            episodes.append(expert_episode(env, task, prompt))
            bar.advance(job)
    return episodes
