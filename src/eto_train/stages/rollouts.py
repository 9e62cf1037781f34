"""Playing a list of episodes into a stage folder, resumably (shared by eval and explore)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.console import Console

from .. import faultpoints
from ..distributed import free_accelerator_memory, is_main, wait_for_manifest
from ..envs import Task, make_env
from ..envs.faults import fault_mark, fault_summary, new_play
from ..evaluation import evaluate
from ..model.load import is_local, load_model, load_tokenizer
from ..prompting import PromptConfig
from ..records import Episode, PolicyRef
from ..rollout import GenerationConfig, Policy, RolloutConfig, WorkItem, run_rollouts
from ..stage import Stage, config_hash, copy_outputs, to_plain
from ..store import append_episodes, drop_partial_tail, read_episodes


def make_policy(cfg, policy_path: str, sampling: dict[str, Any]):
    """The rollout engine's policy for ``eval.backend``: hf (batched, KV-cached; CPU or GPU)
    or vllm (GPU; the checkpoint is loaded into a vLLM engine once per policy)."""
    gen = GenerationConfig(**sampling)
    backend = cfg.eval.get("backend", "hf")
    if backend == "vllm":
        from ..rollout_vllm import VLLMPolicy

        return VLLMPolicy.from_checkpoint(policy_path, gen, cfg.model.max_context, dtype=cfg.model.dtype,
                                          seed=cfg.seed, trust_remote_code=cfg.trust_remote_code,
                                          **to_plain(cfg.eval.get("vllm") or {}))
    if backend != "hf":
        raise ValueError(f"eval.backend={backend!r}: use hf or vllm")
    tok = load_tokenizer(policy_path, trust_remote_code=cfg.trust_remote_code)
    model = load_model(policy_path, dtype=cfg.model.dtype, trust_remote_code=cfg.trust_remote_code, device="auto")
    return Policy(model, tok, gen, cfg.model.max_context)


class Rollouts:
    """One policy that plays work lists into stage folders.

    The policy is loaded on first use, by the main process only: under `accelerate launch`
    the other processes wait for the main one's episodes instead of playing them again.
    """

    def __init__(self, cfg, policy_path: str, ref: PolicyRef, sampling: dict[str, Any], batch_size: int):
        self.cfg, self.path, self.ref = cfg, policy_path, ref
        self.env_cfg, self.prompt = to_plain(cfg.env), PromptConfig(**to_plain(cfg.prompt))
        self.sampling, self.batch_size = sampling, batch_size
        self.backend = cfg.eval.get("backend", "hf")
        self._policy = None
        self._tasks: dict[str, list[Task]] = {}

    @property
    def policy(self):
        if self._policy is None:
            free_accelerator_memory()  # a trainer that just finished may still hold the GPU
            self._policy = make_policy(self.cfg, self.path, self.sampling)
        return self._policy

    def close(self) -> None:
        """Release the engine (vLLM holds most of the GPU until it is shut down)."""
        if self._policy is not None and hasattr(self._policy, "close"):
            self._policy.close()
        self._policy = None
        free_accelerator_memory()

    def tasks(self, split: str) -> list[Task]:
        if split not in self._tasks:
            env = make_env(self.env_cfg)
            try:
                self._tasks[split] = env.tasks(split)
            finally:
                env.close()
        return self._tasks[split]

    def play(self, name: str, out: Path, work: list[WorkItem | tuple], extra_config: dict | None = None,
             share: Path | None = None) -> list[Episode]:
        """Episodes of ``work`` in ``out/episodes.jsonl``, playing only those not recorded yet.

        With ``share`` (a cache folder), a finished play with the very same stage config (the
        policy id carries its weights' hash) is copied instead of played again, and this play is
        published there when it finishes: the jobs of a sweep that explore the same policy the
        same way play it once.
        """
        console = Console(markup=False)
        work = [w if isinstance(w, WorkItem) else WorkItem(*w) for w in work]
        # The work list's hash names the tasks played; the other splits' definitions are left out
        # so that adding a held-out split does not invalidate (and replay) every evaluation.
        # the work hash lists the tasks: how splits are drawn (splits, dev_holdout) and how dev
        # is scored (metric) do not change an episode
        env_scope = {k: v for k, v in self.env_cfg.items() if k not in ("splits", "dev_holdout", "metric")}
        stage = Stage(name, out, {"env": env_scope, "prompt": to_plain(self.cfg.prompt), "seed": self.cfg.seed,
                                  "sampling": self.sampling, "policy": self.ref.id,
                                  "work": config_hash([w.key(self.ref.id, self.cfg.seed) for w in work]),
                                  "episodes": len(work), **(extra_config or {}),
                                  **({"backend": self.backend} if self.backend != "hf" else {})},
                      inputs={"policy": self.path} if is_local(self.path) else {})
        file = out / "episodes.jsonl"
        if stage.done():
            return read_episodes(file)
        cached = share / config_hash(stage.config) if share is not None else None
        if cached is not None and is_main() and Stage(name, cached, stage.config, stage.inputs).done():
            console.print(f"[{name}] same policy and config already played: reusing {cached}")
            copy_outputs(cached, out, ["episodes.jsonl"])
            return read_episodes(file)
        if not is_main():
            wait_for_manifest(stage.manifest_path, config_hash(stage.config))
            if not stage.done():
                raise RuntimeError(f"[{name}] the main process finished with other inputs than this process's")
            return read_episodes(file)
        if not stage.begin():
            file.unlink(missing_ok=True)  # results of another config or policy: start clean
        drop_partial_tail(file)  # a killed writer's half line must not merge with new appends
        seen = {e.episode_id for e in read_episodes(file)} if file.exists() else set()
        todo = [w for w in work if w.key(self.ref.id, self.cfg.seed) not in seen]
        if seen:
            console.print(f"[{name}] resuming: {len(seen)} episodes already recorded, {len(todo)} to go")
        rcfg = RolloutConfig(batch_size=self.batch_size, env_retries=self.cfg.eval.env_retries, seed=self.cfg.seed,
                             overlap_env=self.cfg.eval.overlap_env)
        mark = fault_mark()
        new_play()  # fault attempt counts start afresh for this stage (see envs/faults.py)
        with console.status(f"[{name}] {len(todo)} episodes, {self.batch_size} in parallel"):
            run_rollouts(todo, lambda: make_env(self.env_cfg), self.policy, self.ref, self.prompt, rcfg,
                         on_episode=lambda ep: (append_episodes(file, [ep]), faultpoints.hit(name)))
        episodes = read_episodes(file)
        metrics = evaluate(episodes)["overall"]
        if self.env_cfg.get("faults"):
            metrics["faults"] = fault_summary(mark)  # injected by envs.faults in this process
        stage.finish(metrics, policy=self.ref.id)
        if cached is not None:
            copy_outputs(out, cached, ["episodes.jsonl"])
        return episodes

