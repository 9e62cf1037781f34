"""Playing a list of episodes into a stage folder, resumably (shared by eval and explore).

Check, then touch: the policy is checked (finite weights) and loaded before the stage marks
itself running (the settings were checked by the config schema). Done means whole: the stage is
done only when every item of its work list has its episode. A rerun of a finished stage plays into
``<stage>/.next`` and replaces the finished episodes only once it is whole (manifest.Stage).
A finished ``episodes.jsonl`` lists the episodes in work-list order, whoever played them.

Data-parallel play (``accelerate launch`` / torchrun, ``rollout.data_parallel: true``, the default):
rank 0 checks, begins the stage and folds in the shards of an interrupted earlier play, then
publishes a plan (``<work>/shards/plan.json``: the items still to play, dealt to the ranks by
task); every rank plays its share into ``shards/rank<r>.jsonl`` and marks it done (or failed);
rank 0 merges the shards into ``episodes.jsonl`` and finishes the stage, the others wait for
its manifest. Ranks meet through files only: an exploration can outlast a collective's timeout.

What the number of ranks changes. Greedy episodes do not depend on which process plays them
beside which others (the batched engine's greedy outputs match one-at-a-time play, see `make
bench`), so the merged file is the one a single process writes. Sampled episodes do: a process
draws every row's tokens from one RNG stream, seeded once per play, so which items share a
process and a batch changes the draws (as a batch size or a resume does). Fault injection counts
attempts per task (envs/faults.py) and a task's items are dealt to one rank: with one item per
task (evaluation, exploration with one sample) the faults drawn are the same for any number of
ranks; several items of one task share the counts in play order, as in one process."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import time
from pathlib import Path

from rich.console import Console

from .. import killpoints, layout
from ..config import Config, RolloutSection
from ..distributed import (free_accelerator_memory, is_main, poll, process_started, rank, wait_for_manifest,
                           world_size)
from ..envs import Task, make_env, registry
from ..envs.faults import fault_mark, fault_summary, new_play
from ..evaluation import evaluate
from ..layout import PLAN, SHARDS  # data-parallel bookkeeping under the stage's work folder; gone once it is done
from ..manifest import NEXT, Stage
from ..model.load import is_local, load_model, load_tokenizer
from ..prompting import PromptConfig, answer_room_warning
from ..records import NOT_POLICY_FAULT, Episode, PolicyRef
from ..runtime import config_hash
from ..store import append_episodes, drop_partial_tail, read_episodes, read_jsonl, write_json, write_jsonl
from ..training.save import check_finite_weights
from .loop import GenerationConfig, Policy, RolloutConfig, WorkItem, run_rollouts
from .progress import RolloutProgress
from .vllm_engine import VLLMPolicy, vllm_installed

# what a rollout stage writes in its folder (evaluate adds metrics.json, derived from the episodes):
# a rerun of a finished stage replaces exactly these, once it has played every episode
OUTPUTS = [layout.EPISODES, layout.METRICS]
SHARD_WAIT_S = 1800  # rank 0 waits at least this long (or twice its own share's time) for the other shards
# A rank playing its share beats every few seconds (shards/rank<r>.alive); rank 0 names a rank whose beat
# stopped for this long (a killed process, a lost machine) instead of waiting SHARD_WAIT_S for it.
# ETO_TRAIN_RANK_SILENCE_S overrides it (a slow shared file system may need more).
RANK_SILENCE_S = 120.0
SILENCE_ENV = "ETO_TRAIN_RANK_SILENCE_S"


def rank_silence_s() -> float:
    try:
        return float(os.environ.get(SILENCE_ENV, RANK_SILENCE_S))
    except ValueError:
        return RANK_SILENCE_S


class Heartbeat:
    """While a rank plays its share: ``shards/rank<r>.alive`` rewritten every few seconds by a thread
    ({plan, rank, pid, host, beat}); rank 0 compares beats, never clocks (two machines' clocks differ)."""

    def __init__(self, shards: Path, plan: dict) -> None:
        import threading

        self.path, self.plan, self.beat = shards / f"rank{rank()}.alive", plan["id"], 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="eto-heartbeat", daemon=True)

    def _write(self) -> None:
        import socket

        self.beat += 1
        try:
            write_json(self.path, {"plan": self.plan, "rank": rank(), "pid": os.getpid(), "host": socket.gethostname(),
                                   "beat": self.beat})
        except OSError:
            pass  # a missed beat; the share's own writes say more

    def _run(self) -> None:
        interval = max(0.5, min(10.0, rank_silence_s() / 6))
        while not self._stop.wait(interval):
            self._write()

    def __enter__(self) -> "Heartbeat":
        self._write()
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


def chosen_backend(backend: str) -> str:
    """``rollout.backend`` as played: ``hf`` and ``vllm`` as they are; ``auto`` (the default) is vLLM
    whenever it is installed, the KV engine (``hf``) otherwise: the issue-35 rule, where vLLM wins it
    is the default (the figures, its start apart: docs/lab/bench.md). Under a multi-process launch ``auto``
    takes vLLM only with a CUDA GPU for each process of the node (vllm_engine.own_gpu), where it can run."""
    if backend != "auto":
        return backend
    if not vllm_installed():
        return "hf"
    if world_size() > 1:
        import torch

        local = int(os.environ.get("LOCAL_WORLD_SIZE") or world_size())
        if not torch.cuda.is_available() or torch.cuda.device_count() < local:
            return "hf"
    return "vllm"


def make_policy(cfg: Config, policy_path: str, settings: RolloutSection):
    """The rollout engine's policy for ``settings.backend`` (``settings``: the effective rollout
    section; ``auto`` resolved by :func:`chosen_backend`): hf (batched, KV-cached; CPU or GPU) or
    vllm (the checkpoint is loaded into a vLLM engine once per policy, with ``settings.vllm``'s
    keywords)."""
    gen = GenerationConfig(**settings.generation.model_dump())
    if chosen_backend(settings.backend) == "vllm":
        if settings.backend == "auto" and is_main():
            Console(markup=False).print("rollout.backend=auto: vLLM is installed, so vLLM plays (on a CPU its "
                                        "engine takes 1-2 minutes to start); rollout.backend=hf plays on the "
                                        "project's KV engine")
        return VLLMPolicy.from_checkpoint(policy_path, gen, cfg.model.max_context, dtype=cfg.model.dtype,
                                          seed=cfg.seed, trust_remote_code=cfg.trust_remote_code,
                                          **(settings.vllm.model_dump() if settings.vllm else {}))
    tok = load_tokenizer(policy_path, trust_remote_code=cfg.trust_remote_code)
    warning = answer_room_warning(tok, [m if isinstance(m, dict) else m.model_dump() for m in cfg.prompt.example or []],
                                  gen.max_new_tokens)
    if warning and is_main():
        Console(markup=False).print(f"warning: {warning}")
    model = load_model(policy_path, dtype=cfg.model.dtype, trust_remote_code=cfg.trust_remote_code, device="auto")
    return Policy(model, tok, gen, cfg.model.max_context)


class Rollouts:
    """One policy that plays work lists into stage folders, with one effective rollout section.

    ``settings`` is ``cfg.rollout`` merged with the calling stage's overrides
    (``cfg.rollout.merged(cfg.eval.rollout)``, ``cfg.rollout.merged(cfg.eto.explore.rollout)``):
    batch size, backend, retries, overlap, data-parallel and decoding all come from it, checked by
    the config schema. The policy is loaded on first use. Under `accelerate launch` every process
    loads it and plays its share of each work list (``rollout.data_parallel: false``: the main
    process plays everything and the others wait for its episodes).
    """

    def __init__(self, cfg: Config, policy_path: str, ref: PolicyRef, settings: RolloutSection):
        self.cfg, self.path, self.ref, self.settings = cfg, policy_path, ref, settings
        self.env_cfg, self.prompt = cfg.env.plain(), PromptConfig(**cfg.prompt.plain())
        self.sampling = settings.generation.model_dump()  # every decoding key: the stage hash names them all
        self.backend = chosen_backend(settings.backend)  # the engine that plays: part of the stage hash
        self.data_parallel = world_size() > 1 and settings.data_parallel
        self._policy = None
        self._weights_checked = False
        self._tasks: dict[str, list[Task]] = {}
        self._identity: dict[str, str] | None = None

    @property
    def policy(self):
        if self._policy is None:
            free_accelerator_memory()  # a trainer that just finished may still hold the GPU (every rank)
            self._policy = make_policy(self.cfg, self.path, self.settings)
        return self._policy

    def rollout_config(self) -> RolloutConfig:
        """The engine settings (the schema checked them: nothing is played with a batch of 0)."""
        return RolloutConfig.of(self.settings, self.cfg.seed)

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
                self._identity = self._identity or registry.identity(self.env_cfg, env)
                self._tasks[split] = env.tasks(split)
            finally:
                env.close()
        return self._tasks[split]

    def identity(self) -> dict[str, str]:
        """The adapter and its version (envs.registry.identity): part of every play's stage hash."""
        if self._identity is None:
            env = make_env(self.env_cfg)
            try:
                self._identity = registry.identity(self.env_cfg, env)
            finally:
                env.close()
        return self._identity

    def play(self, name: str, out: Path, work: list[WorkItem | tuple], extra_config: dict | None = None,
             share: Path | None = None) -> list[Episode]:
        """Episodes of ``work`` in ``out/episodes.jsonl``, playing only those not recorded yet.

        With ``share`` (a cache folder), a finished play with the very same stage config (the
        policy id carries its weights' hash) is copied instead of played again, and this play is
        published there when it finishes: the jobs of a sweep that explore the same policy the
        same way play it once.

        In order: the stage and its hash (:meth:`_stage`); a finished stage, or a cached copy of
        one, taken as it is; a process other than the main one follows the main one's play
        (:meth:`_follow`); the policy checked, then what an earlier play recorded resumed
        (:meth:`_resume`); the rest played, here or in every rank's shard (:meth:`_play_here`,
        :meth:`_play_shards`); the episodes merged whole (:meth:`_merge`) and the stage finished
        (:meth:`_finish`: environment failures over the share refused, metrics, faults).
        """
        console = Console(markup=False)
        work = [w if isinstance(w, WorkItem) else WorkItem(*w) for w in work]
        keys = [w.key(self.ref.id, self.cfg.seed) for w in work]
        stage = self._stage(name, out, keys, extra_config)
        if stage.done():
            return read_episodes(out / layout.EPISODES)
        chash, plan = config_hash(stage.config), None
        cached = share / chash if share is not None else None
        try:
            if cached is not None and is_main() and stage.reuse(cached, [layout.EPISODES]):
                shutil.rmtree(out / SHARDS, ignore_errors=True)  # an interrupted play's, if any
                return read_episodes(out / layout.EPISODES)
            if not is_main():
                return self._follow(name, stage, work, keys)
            self.check_policy()  # check, then touch: finite weights, loaded
            todo = self._resume(name, stage, work, keys, console)
            if self.data_parallel:
                plan = publish_plan(name, stage, chash, [(k, w.task.task_id) for w, k in todo])
                faults = self._play_shards(name, stage, plan, work, keys)
            else:
                faults = self._play_here(name, stage.work / layout.EPISODES, [w for w, _ in todo], len(work), console)
            episodes = self._merge(name, stage.work / layout.EPISODES, keys)
            self._finish(name, stage, episodes, faults, plan)  # swaps a rerun's episodes in
        except BaseException as exc:
            if plan is not None:  # the other ranks stop waiting for a merge that will not come
                mark_failed(stage.work / SHARDS, plan, exc)
            raise
        finally:
            stage.release()  # an error: the next run (of this or another process) may take the stage
        if cached is not None:
            stage.publish(cached, [layout.EPISODES])
        return episodes

    def _stage(self, name: str, out: Path, keys: list[str], extra_config: dict | None) -> Stage:
        """The play's stage, whose config (its hash) says what the episodes depend on.

        The work list's hash names the tasks played; the other splits' definitions are left out so
        that adding a held-out split does not invalidate (and replay) every evaluation. How splits
        are drawn (splits, dev_holdout) and how dev is scored (metric), how many processes step the
        environments (workers) and the guard's bounds (call_timeout_s, max_observation_chars) do
        not change an episode; the adapter and its version do (environment=)."""
        env_scope = {k: v for k, v in self.env_cfg.items() if k == "faults" or k not in registry.NOT_HASHED}
        return Stage(name, out, {"env": env_scope, "prompt": self.cfg.prompt.plain(), "seed": self.cfg.seed,
                                 "sampling": self.sampling, "policy": self.ref.id,
                                 "work": config_hash(keys),
                                 "episodes": len(keys), **(extra_config or {}),
                                 **({"backend": self.backend} if self.backend != "hf" else {})},
                     inputs={"policy": self.path} if is_local(self.path) else {}, outputs=OUTPUTS,
                     environment=self.identity(), refuse=self._refused)

    def _resume(self, name: str, stage: Stage, work: list[WorkItem], keys: list[str],
                console: Console) -> list[tuple[WorkItem, str]]:
        """Begin the stage and keep what an earlier play of it recorded: the (item, key) pairs still to play.

        A finished stage's episodes stay in place while a rerun plays into stage.work (.next). Not
        resumable: the partial play of another config or policy, under its "running" manifest (a
        finished play is never here: its rerun works in .next; a damaged or missing manifest beside
        episodes stopped stage.done() with DamagedManifest, so nothing unvouched is deleted)."""
        resumable = stage.begin()
        file, shards = stage.work / layout.EPISODES, stage.work / SHARDS
        if not resumable:  # start clean
            file.unlink(missing_ok=True)
            shutil.rmtree(shards, ignore_errors=True)
            if (stage.work / REFUSED).exists():  # a refused play's statistics go with its episodes
                (stage.work / layout.METRICS).unlink(missing_ok=True)
                (stage.work / REFUSED).unlink()
        drop_partial_tail(file)  # a killed writer's half line must not merge with new appends
        folded = fold_shards(file, keys)  # what the ranks of an interrupted data-parallel play recorded
        replay_refused(name, stage.work, console)  # a play refused for its environment failures: those again
        seen = {e.episode_id for e in read_episodes(file)} if file.exists() else set()
        todo = [(w, k) for w, k in zip(work, keys) if k not in seen]
        if seen:
            console.print(f"[{name}] resuming: {len(seen)} episodes already recorded, {len(todo)} to go"
                          + (f" ({folded} of them from the shards of a data-parallel play)" if folded else ""))
        return todo

    def _play_here(self, name: str, file: Path, todo: list[WorkItem], total: int, console: Console) -> dict:
        """One process plays ``todo`` into ``file`` (appended episode by episode); the faults injected meanwhile."""
        rcfg = self.rollout_config()
        mark = fault_mark()
        new_play()  # fault attempt counts start afresh for this stage (see envs/faults.py)
        with RolloutProgress(_label(name), total=total, done=total - len(todo), console=console) as bar:
            run_rollouts(todo, lambda: make_env(self.env_cfg), self.policy, self.ref, self.prompt, rcfg,
                         on_episode=lambda ep: (append_episodes(file, [ep]), killpoints.hit(name)),
                         progress=bar)
        return fault_summary(mark)

    def _play_shards(self, name: str, stage: Stage, plan: dict, work: list[WorkItem], keys: list[str]) -> dict:
        """Rank 0 of a data-parallel play: its own share of ``plan``, then every other rank's done; the
        faults all of them injected."""
        own = self._play_share(name, stage.work, plan, work, keys)
        return wait_for_shards(name, stage.work / SHARDS, plan, timeout_s=max(SHARD_WAIT_S, 2 * own["seconds"]),
                               poll_s=min(5.0, rank_silence_s() / 4))

    @staticmethod
    def _merge(name: str, file: Path, keys: list[str]) -> list[Episode]:
        """The play's episodes, whole (:func:`check_whole`) and in work-list order, whoever played them:
        the ranks' shards (data-parallel) folded into ``file`` first."""
        fold_shards(file, keys)
        episodes = read_episodes(file)
        check_whole(name, keys, episodes, file)
        fold_shards(file, keys, order=True)
        pos = {k: i for i, k in enumerate(keys)}
        episodes.sort(key=lambda e: pos[e.episode_id])
        return episodes

    def _finish(self, name: str, stage: Stage, episodes: list[Episode], faults: dict, plan: dict | None) -> None:
        """Environment failures over rollout.max_env_failure_share (or all): not done, not cached
        (:func:`refuse_failures`); else the stage's metrics (the faults injected, when any are) and done."""
        refuse_failures(name, episodes, stage.work, self.settings.max_env_failure_share, self.ref.id)
        metrics = evaluate(episodes)["overall"]
        if self.env_cfg.get("faults"):
            metrics["faults"] = faults  # injected by envs.faults while this play ran (every rank)
        shutil.rmtree(stage.work / SHARDS, ignore_errors=True)  # nothing but OUTPUTS in the finished folder
        extra = {"data_parallel": {"world_size": plan["world_size"], "played": plan["played"]}} if plan else {}
        stage.finish(metrics, policy=self.ref.id, **extra)  # swaps a rerun's episodes in

    def _refused(self, manifest: dict, folder: Path) -> str | None:
        """Why a finished play (here or in a sweep's cache, e.g. one an older version finished) does not
        count as done: its episodes are environment failures over rollout.max_env_failure_share, or all."""
        m = manifest.get("metrics") or {}
        n, k = m.get("episodes"), (m.get("environment_failures") or 0) + (m.get("other_failures") or 0)
        if not isinstance(n, int) or not over_share(k, n, self.settings.max_env_failure_share):
            return None
        return failure_text(k, n, self.settings.max_env_failure_share, _failed_rows(folder / layout.EPISODES))

    def _follow(self, name: str, stage: Stage, work: list[WorkItem], keys: list[str]) -> list[Episode]:
        """A process other than the main one: play its share of the main process's plan (when
        data-parallel), then wait for the stage's manifest and read the merged episodes."""
        chash = config_hash(stage.config)
        plan = wait_for_plan(stage, chash) if self.data_parallel else None
        if plan is not None:
            work_dir = stage.dir / plan["work"]
            try:
                with Heartbeat(work_dir / SHARDS, plan):  # rank 0 tells a dead rank from a slow one
                    self._play_share(name, work_dir, plan, work, keys)
            except BaseException as exc:
                mark_failed(work_dir / SHARDS, plan, exc)  # rank 0 stops waiting for this share
                raise
            main_failed = lambda: failure(work_dir / SHARDS, plan, 0)  # noqa: E731
        wait_for_manifest(stage.manifest_path, chash, abort=main_failed if plan is not None else None)
        if not stage.done():
            raise RuntimeError(f"[{name}] the main process finished with other inputs than this process's")
        return read_episodes(stage.dir / layout.EPISODES)

    def _play_share(self, name: str, work_dir: Path, plan: dict, work: list[WorkItem], keys: list[str]) -> dict:
        """Play this rank's items of ``plan`` into ``<work_dir>/shards/rank<r>.jsonl``, then mark the
        share done (the marker, returned, carries the faults injected meanwhile)."""
        r, t0 = rank(), time.time()
        shard = layout.shard(work_dir, r)
        drop_partial_tail(shard)
        have = {row["episode_id"] for _, row in read_jsonl(shard, allow_partial_tail=True)} if shard.exists() else set()
        want = set(plan["shards"][r]) - have
        todo = [w for w, k in zip(work, keys) if k in want]
        mark = fault_mark()
        if todo:
            rcfg = self.rollout_config()
            console = Console(markup=False)
            console.print(f"[{name}] rank {r} of {plan['world_size']}: playing {len(todo)} of "
                          f"{plan['todo']} episodes, {rcfg.batch_size} in parallel")
            new_play()  # fault attempt counts start afresh for this share (every item of a task is here)
            # the main process draws its share's bar; one live bar per terminal (the ranks share it)
            share = len(plan["shards"][r])
            with RolloutProgress(f"{_label(name)} (rank {r} of {plan['world_size']})", total=share,
                                 done=share - len(todo), console=console, draw=is_main()) as bar:
                run_rollouts(todo, lambda: make_env(self.env_cfg), self.policy, self.ref, self.prompt, rcfg,
                             on_episode=lambda ep: (append_episodes(shard, [ep]), killpoints.hit(name)),
                             progress=bar)
        done = {"plan": plan["id"], "rank": r, "played": len(todo), "faults": fault_summary(mark),
                "seconds": round(time.time() - t0, 2)}
        write_json(shard.with_suffix(".done"), done)
        return done


def _label(name: str) -> str:
    """A stage's progress bar label: ``eval/bc/seen`` -> ``eval bc seen``."""
    return name.replace("/", " ")


# -- data-parallel play: the plan, the shards and their markers ------------------------------------
def deal(keys: list[str], task_ids: list[str], n: int) -> list[list[str]]:
    """Each rank's items: the tasks in order of first appearance, dealt round-robin, every item of
    a task to the same rank (fault attempts are counted per task, envs/faults.py), work order kept."""
    group: dict[str, int] = {}
    shares: list[list[str]] = [[] for _ in range(n)]
    for k, t in zip(keys, task_ids):
        shares[group.setdefault(t, len(group)) % n].append(k)
    return shares


def publish_plan(name: str, stage: Stage, chash: str, todo: list[tuple[str, str]]) -> dict:
    """Rank 0: the plan the other ranks wait for, written atomically. It names the work folder
    (``.`` or ``.next``) and the items still to play (``todo``: (key, task id), in work order)
    dealt to the ranks; its id tells this play's markers from an interrupted play's."""
    shares = deal([k for k, _ in todo], [t for _, t in todo], world_size())
    plan = {"stage": name, "id": secrets.token_hex(8), "config_hash": chash, "world_size": len(shares),
            "work": str(stage.work.relative_to(stage.dir)), "todo": len(todo), "shards": shares,
            "played": {str(r): len(s) for r, s in enumerate(shares)}, "written_at": time.time()}
    shards = stage.work / SHARDS
    for old in shards.glob("rank*.*"):  # an interrupted play's markers (its episodes are folded in)
        old.unlink()
    write_json(shards / PLAN, plan)
    return plan


def wait_for_plan(stage: Stage, chash: str, since: float | None = None, poll_s: float = 5.0,
                  timeout_s: float | None = None) -> dict | None:
    """A rank other than 0: the plan of this play, or None when the stage is done meanwhile (the
    main process adopted a shared copy). Only a plan written after this process started counts
    (``since``): one left by a killed run of the same config is stale (its work list is longer)."""
    since = process_started() if since is None else since
    places = [stage.dir / SHARDS / PLAN, stage.dir / NEXT / SHARDS / PLAN]

    def ready():
        m = _read_json(stage.manifest_path)
        if m.get("status") == "done" and m.get("config_hash") == chash:
            return "done"
        plans = [p for p in map(_read_json, places) if p.get("config_hash") == chash
                 and p.get("world_size") == world_size() and p.get("written_at", 0) > since]
        return max(plans, key=lambda p: p["written_at"]) if plans else None

    print(f"[rank {rank()}] waiting for the main process's plan of {stage.dir}", flush=True)
    got = poll(ready, poll_s, timeout_s)
    return None if got == "done" else got


def wait_for_shards(name: str, shards: Path, plan: dict, timeout_s: float, poll_s: float = 5.0,
                    silence_s: float | None = None) -> dict:
    """Rank 0: wait until every rank marked its share of ``plan`` done; the faults they injected,
    summed. A rank that failed (its marker), whose heartbeat stopped for ``silence_s`` (default
    :func:`rank_silence_s`: killed, or its machine lost), or that is silent after ``timeout_s`` is an
    error naming it, what it kept and how to resume."""
    ranks = range(plan["world_size"])
    silence_s = rank_silence_s() if silence_s is None else silence_s
    beats: dict[int, tuple[int, float]] = {}  # rank -> (its last beat, when this process saw it change)

    def silent() -> list[str]:
        now, out = time.monotonic(), []
        for r in ranks:
            if r == rank() or _read_json(shards / f"rank{r}.done").get("plan") == plan["id"]:
                continue
            alive = _read_json(shards / f"rank{r}.alive")
            if alive.get("plan") != plan["id"]:
                continue  # not started its share yet (loading its policy): timeout_s decides
            beat = alive.get("beat", 0)
            if beats.get(r, (None, 0.0))[0] != beat:
                beats[r] = (beat, now)
            elif now - beats[r][1] > silence_s:
                kept = _complete_lines(shards / f"rank{r}.jsonl")
                out.append(f"rank {r} (pid {alive.get('pid')} on {alive.get('host')}) stopped: no sign of life for "
                           f"{now - beats[r][1]:.0f} s (its heartbeat {shards / f'rank{r}.alive'} stopped at beat "
                           f"{beat}: a killed process or a lost machine); its {kept} recorded episode(s) are kept in "
                           f"{shards / f'rank{r}.jsonl'}")
        return out

    def ready():
        bad = [f"rank {r}: {e}" for r in ranks if (e := failure(shards, plan, r))]
        if bad:
            raise RuntimeError(f"[{name}] {'; '.join(bad)}. The stage is not done; run the same command again "
                               f"to play what is missing")
        dead = silent()
        if dead:
            raise RuntimeError(f"[{name}] {'; '.join(dead)}. The stage is not done (what every rank recorded is kept): "
                               f"run the same command again, on every machine, to play what is missing")
        marks = [_read_json(shards / f"rank{r}.done") for r in ranks]
        return marks if all(m.get("plan") == plan["id"] for m in marks) else None

    try:
        marks = poll(ready, poll_s, timeout_s)
    except TimeoutError:
        missing = [r for r in ranks if _read_json(shards / f"rank{r}.done").get("plan") != plan["id"]]
        raise TimeoutError(f"[{name}] rank(s) {missing} did not finish their share after {timeout_s:.0f} s "
                           f"(no done or failed marker in {shards}); the stage is not done") from None
    return {k: sum(m["faults"][k] for m in marks) for k in marks[0]["faults"]}


def mark_failed(shards: Path, plan: dict, exc: BaseException) -> None:
    """This rank's share of ``plan`` failed: say so beside the shards (the other ranks stop waiting)."""
    try:
        write_json(shards / f"rank{rank()}.failed", {"plan": plan["id"], "error": f"{type(exc).__name__}: {exc}"})
    except OSError:
        pass  # the error being raised says more than this one


def failure(shards: Path, plan: dict, r: int) -> str | None:
    """Rank ``r``'s error, if it marked its share of ``plan`` failed."""
    m = _read_json(shards / f"rank{r}.failed")
    return f"failed with {m.get('error')}" if m.get("plan") == plan["id"] else None


def fold_shards(file: Path, keys: list[str], order: bool = False) -> int:
    """Fold the complete episodes of the shard files beside ``file`` into it (one per episode id,
    work-list keys only) and remove the shard files; ``order``: also put the file in work-list
    order. Returns how many episodes came from the shards. The new file is written whole
    (temporary file, rename) before the shards go, so a kill in between loses nothing."""
    shards = sorted((file.parent / SHARDS).glob("rank*.jsonl"))
    rows = {}
    for _, row in read_jsonl(file, allow_partial_tail=True) if file.exists() else ():
        rows.setdefault(row["episode_id"], row)
    mine, want = len(rows), set(keys)
    for shard in shards:
        for _, row in read_jsonl(shard, allow_partial_tail=True):
            if row.get("episode_id") in want:
                rows.setdefault(row["episode_id"], row)
    pos = {k: i for i, k in enumerate(keys)}
    ordered = sorted(rows.values(), key=lambda r: pos.get(r["episode_id"], len(pos)))  # extras last, as found
    if len(rows) > mine or (order and list(rows) != [r["episode_id"] for r in ordered]):
        write_jsonl(file, ordered)
    for shard in shards:
        shard.unlink()
    return len(rows) - mine


def _complete_lines(path: Path) -> int:
    try:
        return path.read_bytes().count(b"\n")
    except OSError:
        return 0


def _read_json(path: Path) -> dict:
    """A JSON object from ``path``, or {} while it is missing (or is not one)."""
    try:
        obj = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return obj if isinstance(obj, dict) else {}


# -- environment failures: a play whose episodes are all (or too many) is not done -----------------------
REFUSED = ".environment_failures.json"  # in a stage's work folder: its last play was refused (refuse_failures)
SHARE_KEY = "rollout.max_env_failure_share"


class EnvironmentFailures(RuntimeError):
    """A rollout stage whose episodes ended as environment (orchestrator, evaluator) failures, all of them
    or more than ``rollout.max_env_failure_share``: the stage is not done and not shared through a
    sweep's cache; its episodes are kept, and the same command plays the failed ones again."""


class NothingScored(EnvironmentFailures):
    """Every episode is an environment (or orchestrator) failure: no score of the policy was
    measured, so the command fails instead of reporting n=0."""


def over_share(failures: int, episodes: int, max_share: float) -> bool:
    """All of a play's episodes are failures, or more than ``max_share`` of them."""
    return episodes > 0 and failures > 0 and (failures == episodes or failures > max_share * episodes)


def _failed_rows(file: Path) -> list[dict]:
    """The episode rows of ``file`` that ended as environment failures (for a message; [] unreadable)."""
    try:
        return [row for _, row in read_jsonl(file, allow_partial_tail=True) if row.get("status") in NOT_POLICY_FAULT]
    except (OSError, ValueError):
        return []


def failure_text(failures: int, episodes: int, max_share: float, rows: list[dict]) -> str:
    """``4 of its 4 episodes ended as environment failures (environment_failure: 4; e.g. ...)``."""
    kinds: dict[str, int] = {}
    for row in rows:
        kinds[row["status"]] = kinds.get(row["status"], 0) + 1
    example = next((row.get("error") or (row.get("env_errors") or [""])[-1] for row in rows
                    if row.get("error") or row.get("env_errors")), "")
    share = "all" if failures == episodes else f"more than {SHARE_KEY}={max_share} of them"
    listed = ", ".join(f"{k}: {v}" for k, v in kinds.items())
    return (f"{failures} of its {episodes} episodes ended as environment failures ({share}"
            + (f"; {listed}" if listed else "") + ")" + (f"; e.g. {example[:400]}" if example else ""))


def refuse_failures(name: str, episodes: list[Episode], work: Path, max_share: float, policy: str) -> None:
    """A whole play whose episodes are environment failures over ``max_share`` (or all) is refused:
    :class:`NothingScored` (all) or :class:`EnvironmentFailures`, before the stage is marked done.
    The episodes stay in ``work`` (with ``metrics.json``, their statistics) and a marker says the play
    was refused, so the same command, once the environment is fixed, plays the failed ones again."""
    failed = [e for e in episodes if e.status in NOT_POLICY_FAULT]
    if not over_share(len(failed), len(episodes), max_share):
        (work / REFUSED).unlink(missing_ok=True)
        return
    file = work / layout.EPISODES
    text = failure_text(len(failed), len(episodes), max_share, [e.to_dict() for e in failed])
    if is_main():
        write_json(work / layout.METRICS, {**evaluate(episodes), "policy": policy})
        write_json(work / REFUSED, {"failures": len(failed), "episodes": len(episodes)})
    kept = (f"The episodes are kept in {file}; the stage is not done (nor shared through a cache). Fix the "
            f"environment (its server, simulator or env.call_timeout_s), then run the same command again")
    if len(failed) == len(episodes):
        kinds = " or ".join(sorted({e.status for e in failed}))
        raise NothingScored(f"[{name}] every one of its {len(episodes)} episodes ended as {kinds} (the environment "
                            f"failed every retry, rollout.env_retries), so nothing about the policy was measured: "
                            f"{text}. {kept}: it plays them again")
    raise EnvironmentFailures(f"[{name}] {text}, over {SHARE_KEY}={max_share}. {kept}: it plays the failed ones again "
                              f"(or raise {SHARE_KEY} to accept them)")


def replay_refused(name: str, work: Path, console: Console) -> None:
    """A resumed play that was refused for its environment failures (:func:`refuse_failures`): its
    failed episodes are dropped from the record, so they are played again; the others are kept."""
    marker, file = work / REFUSED, work / layout.EPISODES
    if not marker.exists():
        return
    if file.exists():
        rows = [row for _, row in read_jsonl(file, allow_partial_tail=True)]
        kept = [row for row in rows if row.get("status") not in NOT_POLICY_FAULT]
        if len(kept) < len(rows):
            console.print(f"[{name}] the last play was refused for its environment failures ({len(rows) - len(kept)} "
                          f"of {len(rows)} episodes): playing those again")
            write_jsonl(file, kept)
    (work / layout.METRICS).unlink(missing_ok=True)  # the refused play's statistics
    marker.unlink()


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
