"""Playing a list of episodes into a stage folder, resumably (shared by eval and explore).

Check, then touch: the engine settings are checked and the policy is checked (finite weights)
and loaded before the stage marks itself running. Done means whole: the stage is done only
when every item of its work list has its episode. A rerun of a finished stage plays into
``<stage>/.next`` and replaces the finished episodes only once it is whole (stage.Stage)."""

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
from ..training.save import check_finite_weights

# what a rollout stage writes in its folder (evaluate adds metrics.json, derived from the episodes):
# a rerun of a finished stage replaces exactly these, once it has played every episode
OUTPUTS = ["episodes.jsonl", "metrics.json"]


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

    def __init__(self, cfg, policy_path: str, ref: PolicyRef, sampling: dict[str, Any], batch_size: int,
                 batch_key: str = "eval.batch_size"):
        self.cfg, self.path, self.ref = cfg, policy_path, ref
        self.env_cfg, self.prompt = to_plain(cfg.env), PromptConfig(**to_plain(cfg.prompt))
        self.sampling, self.batch_size, self.batch_key = sampling, batch_size, batch_key
        self.backend = cfg.eval.get("backend", "hf")
        self._policy = None
        self._weights_checked = False
        self._tasks: dict[str, list[Task]] = {}

    @property
    def policy(self):
        if self._policy is None:
            free_accelerator_memory()  # a trainer that just finished may still hold the GPU
            self._policy = make_policy(self.cfg, self.path, self.sampling)
        return self._policy

    def rollout_config(self) -> RolloutConfig:
        """The engine settings, checked (errors name the key): nothing is played with a batch of 0."""
        bs, retries = self.batch_size, self.cfg.eval.env_retries
        if isinstance(bs, bool) or not isinstance(bs, int) or bs < 1:
            raise ValueError(f"{self.batch_key}={bs!r}: the number of episodes played in parallel must be an "
                             f"integer >= 1")
        if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
            raise ValueError(f"eval.env_retries={retries!r}: must be an integer >= 0")
        n = self.sampling.get("max_new_tokens")
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"eval.generation.max_new_tokens={n!r}: must be an integer >= 1")
        return RolloutConfig(batch_size=bs, env_retries=retries, seed=self.cfg.seed,
                             overlap_env=self.cfg.eval.overlap_env)

    def check_policy(self) -> None:
        """Refuse a local checkpoint with NaN/Inf weights (it would play empty outputs and score 0%
        as if that were the policy's skill), then load the policy: both before a stage writes."""
        if not self._weights_checked and is_local(self.path):
            check_finite_weights(self.path)
        self._weights_checked = True
        self.policy  # noqa: B018 - loads it (a bad backend or checkpoint fails here, not after begin())

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
        keys = [w.key(self.ref.id, self.cfg.seed) for w in work]
        # The work list's hash names the tasks played; the other splits' definitions are left out
        # so that adding a held-out split does not invalidate (and replay) every evaluation.
        # the work hash lists the tasks: how splits are drawn (splits, dev_holdout) and how dev
        # is scored (metric) do not change an episode
        env_scope = {k: v for k, v in self.env_cfg.items() if k not in ("splits", "dev_holdout", "metric")}
        stage = Stage(name, out, {"env": env_scope, "prompt": to_plain(self.cfg.prompt), "seed": self.cfg.seed,
                                  "sampling": self.sampling, "policy": self.ref.id,
                                  "work": config_hash(keys),
                                  "episodes": len(work), **(extra_config or {}),
                                  **({"backend": self.backend} if self.backend != "hf" else {})},
                      inputs={"policy": self.path} if is_local(self.path) else {}, outputs=OUTPUTS)
        file = out / "episodes.jsonl"
        if stage.done():
            return read_episodes(file)
        try:
            cached = share / config_hash(stage.config) if share is not None else None
            if cached is not None and is_main() and Stage(name, cached, stage.config, stage.inputs).done(lock=False):
                console.print(f"[{name}] same policy and config already played: reusing {cached}")
                stage.adopt(cached, ["episodes.jsonl"])
                return read_episodes(file)
            if not is_main():
                wait_for_manifest(stage.manifest_path, config_hash(stage.config))
                if not stage.done():
                    raise RuntimeError(f"[{name}] the main process finished with other inputs than this process's")
                return read_episodes(file)
            # -- check, then touch: the engine settings and the policy (finite weights, loaded) ---------
            rcfg = self.rollout_config()
            self.check_policy()
            # A finished stage's episodes stay in place while a rerun plays into stage.work (.next)
            resumable = stage.begin()
            file = stage.work / "episodes.jsonl"
            if not resumable:
                file.unlink(missing_ok=True)  # results of another config or policy: start clean
            drop_partial_tail(file)  # a killed writer's half line must not merge with new appends
            seen = {e.episode_id for e in read_episodes(file)} if file.exists() else set()
            todo = [w for w, k in zip(work, keys) if k not in seen]
            if seen:
                console.print(f"[{name}] resuming: {len(seen)} episodes already recorded, {len(todo)} to go")
            mark = fault_mark()
            new_play()  # fault attempt counts start afresh for this stage (see envs/faults.py)
            with console.status(f"[{name}] {len(todo)} episodes, {rcfg.batch_size} in parallel"):
                run_rollouts(todo, lambda: make_env(self.env_cfg), self.policy, self.ref, self.prompt, rcfg,
                             on_episode=lambda ep: (append_episodes(file, [ep]), faultpoints.hit(name)))
            episodes = read_episodes(file)
            check_whole(name, keys, episodes, file)
            metrics = evaluate(episodes)["overall"]
            if self.env_cfg.get("faults"):
                metrics["faults"] = fault_summary(mark)  # injected by envs.faults in this process
            stage.finish(metrics, policy=self.ref.id)  # swaps a rerun's episodes in
        finally:
            stage.release()  # an error: the next run (of this or another process) may take the stage
        if cached is not None:
            copy_outputs(out, cached, ["episodes.jsonl"])
        return episodes


def check_whole(name: str, keys: list[str], episodes: list[Episode], file: Path) -> None:
    """A rollout stage is done only when every item of its work list has exactly one episode
    (an environment failure is an episode too, with its status): else an error, not "done"."""
    ids = [e.episode_id for e in episodes]
    want, have = set(keys), set(ids)
    missing, extra, dup = want - have, have - want, len(ids) - len(have)
    if missing or extra or dup:
        raise RuntimeError(
            f"[{name}] incomplete: {len(want & have)} of {len(want)} work items have an episode in {file} "
            f"({len(missing)} missing, {len(extra)} not in the work list, {dup} recorded twice); the stage is "
            f"not marked done. Run the same command again to play the missing ones")
