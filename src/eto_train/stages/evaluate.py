"""Stage `eval`: batched rollouts of one policy on held-out splits; metrics with 95% CIs.

Episodes are appended to <out>/<split>/episodes.jsonl as they finish; an interrupted
evaluation resumes where it stopped (episodes already recorded are kept, none is played twice).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.console import Console

from .. import layout
from ..errors import remove_empty_tree
from ..evaluation import evaluate, metrics_table
from ..model.load import policy_ref
from ..config import Config, require
from ..distributed import is_main
from ..envs import check_splits
from ..rollouts.play import NothingScored, Rollouts  # noqa: F401 - NothingScored: every episode an environment failure
from ..runtime import setup_runtime
from ..store import write_json_if_changed


def evaluate_policy(cfg: Config, policy_path: str, tag: str, splits, out_root: Path) -> dict[str, Any]:
    """Play ``splits`` with the policy at ``policy_path``; results under ``out_root/<split>``.

    A failed start (a checkpoint refused, e.g. NaN weights) leaves no empty ``out_root``: the
    split's lock, taken before the checkpoint is checked, was its only content. The policy plays
    with ``rollout.*`` merged with ``eval.rollout`` (evaluation's own settings)."""
    require(cfg, "eto_train.stages.evaluate.evaluate_policy")
    existed = out_root.exists()
    try:
        return _evaluate_policy(cfg, policy_path, tag, splits, out_root)
    except BaseException:
        if not existed:
            remove_empty_tree(out_root)  # folders only, and only empty ones
        raise


def _evaluate_policy(cfg: Config, policy_path: str, tag: str, splits, out_root: Path) -> dict[str, Any]:
    if str(policy_path) == str(cfg.model.path):  # the untuned model: a registry model must be built first
        from ..model.wheel import require_built

        require_built(cfg.model)
    setup_runtime(cfg.runtime.rollout_threads)
    ref = policy_ref(policy_path, name=tag)
    rollouts = Rollouts(cfg, policy_path, ref, cfg.rollout.merged(cfg.eval.rollout))
    results = {}
    for split in splits:
        out = out_root / split
        episodes = rollouts.play(f"eval/{tag}/{split}", out, [(t, 0) for t in rollouts.tasks(split)],
                                 extra_config={"split": split})
        res = evaluate(episodes)
        res["policy"] = ref.id
        results[split] = res
        # whole (temporary file, then rename); not rewritten when unchanged (a finished run may be read-only)
        if is_main():  # one writer per file: the main process (global rank 0)
            write_json_if_changed(out / layout.METRICS, res)
    rollouts.close()
    return results


def run(cfg: Config) -> None:
    require(cfg, "eto_train.stages.evaluate.run")
    ev = cfg.eval
    check_splits(cfg.env.plain(), {"eval.splits": list(ev.splits)})  # before anything is loaded or played
    results = evaluate_policy(cfg, ev.policy, ev.tag, list(ev.splits), layout.RunLayout.of(cfg).evaluation(ev.tag))
    policy_id = next(iter(results.values()))["policy"] if results else ev.policy
    Console(width=120, markup=False).print(metrics_table(f"{ev.tag} ({policy_id})", results))
