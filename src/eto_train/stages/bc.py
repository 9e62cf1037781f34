"""Stage `bc`: behavior cloning on the expert trajectories (TRL SFTTrainer, action tokens only)."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console

from .. import layout
from ..config import Config, require
from ..experts import read_experts, usable
from ..manifest import Stage
from ..model.load import check_quantization, is_local
from ..model.wheel import require_built
from ..runtime import setup_runtime, to_plain
from ..training import recipe
from ..training.sft import sft_arguments, sft_conversations

# what the stage writes in its folder (a rerun of a finished bc replaces exactly these, when it has its own)
OUTPUTS = list(layout.TRAINING_OUTPUTS)


def run(cfg: Config) -> dict | None:
    """Train BC if it is not done yet; returns its metrics (None when it was up to date)."""
    require(cfg, "eto_train.stages.bc.run")
    console = Console(markup=False)
    require_built(cfg.model)  # a registry model (model.source) converted by `eto-train model`
    check_quantization(cfg.model.quantization)  # before anything is written (the lock included)
    prepare_inputs(cfg, console)
    setup_runtime(cfg.runtime.train_threads)
    out = Path(cfg.paths.bc)
    inputs = {"experts": cfg.paths.experts}
    if is_local(cfg.model.path):
        inputs["base_model"] = cfg.model.path
    stage = Stage("bc", out, {"model": to_plain(cfg.model), "bc": to_plain(cfg.bc), "seed": cfg.seed,
                              "prompt": to_plain(cfg.prompt)}, inputs=inputs, outputs=OUTPUTS)
    if stage.done():
        return None

    with recipe.held(stage):  # cleanup: the stage's lock is released whatever happens
        # -- setup: the expert trajectories read whole and checked before anything is written
        episodes = read_experts(cfg.paths.experts, cfg.env.name)
        if cfg.bc.only_success and not any(ep.steps and usable(ep) for ep in episodes):
            lost = [e.task_id for e in episodes if not usable(e)]
            raise ValueError(
                f"{cfg.paths.experts}: no usable trajectories for behavior cloning: none of its {len(episodes)} "
                f"episodes is a gold path that won (or an imported one); e.g. {', '.join(lost[:5])}. The experts "
                f"stage named them: the adapter's gold paths do not win in the environment (check its expert_actions "
                f"and success flag), or set bc.only_success=false to clone them anyway")
        convs = sft_conversations(episodes, only_success=cfg.bc.only_success)
        args = sft_arguments(cfg.bc, layout.checkpoints(stage.work), cfg.seed)
        job = recipe.SFTJob("bc", cfg.model.path, convs, args, to_plain(cfg.model), cfg.trust_remote_code)
        # -- train and save: a killed run resumes from its last checkpoint; the policy in bc/model
        t = recipe.train(job, stage.work, begin=stage.begin, console=console)
        # -- the manifest with the run's metrics
        tokens, epochs = t.tokens_per_epoch(), t.result.metrics.get("epoch", cfg.bc.num_train_epochs)
        m = recipe.finish(stage, t, {"epochs": epochs, "trajectories": t.rows, "tokens_per_epoch": tokens,
                                     "tokens_per_second": tokens * epochs / t.result.metrics["train_runtime"]})
    if m:
        console.print(f"[bc] loss {m['train_loss']:.4f} after {m['optimizer_steps']} steps, "
                      f"{m['tokens_per_second']:.0f} tokens/s -> {layout.policy(out)}")
    return m or None


def prepare_inputs(cfg, console: Console) -> None:
    """What `make bc` builds first, when it is not there yet: the expert trajectories (the experts
    stage) and, for a model the run builds (``model.build``), the tiny base model, so that
    ``eto-train bc env=<name>`` runs as written on a fresh run folder. Inputs already there are
    left as they are (their own stages redo them: `eto-train experts`, `eto-train model`)."""
    from . import experts, model

    if not Path(cfg.paths.experts).exists():
        console.print(f"[bc] no expert trajectories at {cfg.paths.experts} yet: running the experts stage first")
        experts.run(cfg)
    if cfg.model.build and not (Path(cfg.model.path) / "config.json").exists():
        console.print(f"[bc] no base model at {cfg.model.path} yet: running the model stage first")
        model.run(cfg)
