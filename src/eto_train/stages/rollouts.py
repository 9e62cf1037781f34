"""Playing a list of episodes into a stage folder, resumably (shared by eval and explore)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.console import Console

from ..envs import Task, make_env
from ..evaluation import evaluate
from ..model.load import is_local, load_model, load_tokenizer
from ..prompting import PromptConfig
from ..records import Episode, PolicyRef
from ..rollout import GenerationConfig, Policy, RolloutConfig, WorkItem, run_rollouts
from ..stage import Stage, config_hash, to_plain
from ..store import append_episodes, drop_partial_tail, read_episodes


class Rollouts:
    """One loaded policy that plays work lists into stage folders."""

    def __init__(self, cfg, policy_path: str, ref: PolicyRef, sampling: dict[str, Any], batch_size: int):
        self.cfg, self.path, self.ref = cfg, policy_path, ref
        self.env_cfg, self.prompt = to_plain(cfg.env), PromptConfig(**to_plain(cfg.prompt))
        self.sampling, self.batch_size = sampling, batch_size
        tok = load_tokenizer(policy_path, trust_remote_code=cfg.trust_remote_code)
        model = load_model(policy_path, dtype=cfg.model.dtype, trust_remote_code=cfg.trust_remote_code)
        self.policy = Policy(model, tok, GenerationConfig(**sampling), cfg.model.max_context)
        self._tasks: dict[str, list[Task]] = {}

    def tasks(self, split: str) -> list[Task]:
        if split not in self._tasks:
            env = make_env(self.env_cfg)
            try:
                self._tasks[split] = env.tasks(split)
            finally:
                env.close()
        return self._tasks[split]

    def play(self, name: str, out: Path, work: list[WorkItem | tuple], extra_config: dict | None = None) -> list[Episode]:
        """Episodes of ``work`` in ``out/episodes.jsonl``, playing only those not recorded yet."""
        console = Console()
        work = [w if isinstance(w, WorkItem) else WorkItem(*w) for w in work]
        stage = Stage(name, out, {"env": self.env_cfg, "prompt": to_plain(self.cfg.prompt), "seed": self.cfg.seed,
                                  "sampling": self.sampling, "policy": self.ref.id,
                                  "work": config_hash([w.key(self.ref.id, self.cfg.seed) for w in work]),
                                  "episodes": len(work), **(extra_config or {})},
                      inputs={"policy": self.path} if is_local(self.path) else {})
        file = out / "episodes.jsonl"
        if stage.done():
            return read_episodes(file)
        if not stage.begin():
            file.unlink(missing_ok=True)  # results of another config or policy: start clean
        drop_partial_tail(file)  # a killed writer's half line must not merge with new appends
        seen = {e.episode_id for e in read_episodes(file)} if file.exists() else set()
        todo = [w for w in work if w.key(self.ref.id, self.cfg.seed) not in seen]
        if seen:
            console.print(f"[{name}] resuming: {len(seen)} episodes already recorded, {len(todo)} to go")
        rcfg = RolloutConfig(batch_size=self.batch_size, env_retries=self.cfg.eval.env_retries, seed=self.cfg.seed)
        with console.status(f"[{name}] {len(todo)} episodes, {self.batch_size} in parallel"):
            run_rollouts(todo, lambda: make_env(self.env_cfg), self.policy, self.ref, self.prompt, rcfg,
                         on_episode=lambda ep: append_episodes(file, [ep]))
        episodes = read_episodes(file)
        stage.finish(evaluate(episodes)["overall"], policy=self.ref.id)
        return episodes
