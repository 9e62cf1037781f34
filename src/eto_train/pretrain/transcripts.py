"""Pretraining transcripts: TextWorldExpress games played three ways, in the policy's chat layout.

Kinds of transcript (``KINDS``), each a whole episode:

- ``gold``: the game's gold path. Coin's and multi-room TWC's gold agents in TextWorldExpress
  are random walks driven by an unseeded ``scala.util.Random`` (``CoinGameGenerator.mkGameWithGoldPath``
  creates ``new Random()``), so their gold paths change from call to call. For those settings
  the gold path here is a seeded depth-first explorer (:func:`walk`) that opens doors, takes
  the task's objects where it sees them and puts each in its assigned container (coin: takes
  the coin); every other game keeps TextWorldExpress's gold path (deterministic there).
  ``gold_source`` in a row says which. The multi-room TWC assignment is read from the game
  itself (``TextWorldExpressEnv.twc_places``): for each object, of the containers the scorer
  accepts, the one nearest the object's start room (then the game's room order, then the
  room's listing order). Not off TextWorldExpress's gold path: when valid containers lie in
  two rooms at the same distance, its random walk picks either, so two runs of one config
  wrote different shards. Wherever its choice does not vary, the rule makes the same one
  (checked on 298 objects of 100 three-room tasks). For these settings TextWorldExpress's gold
  path is never asked for, so none of its output reaches a transcript (the random and detour
  transcripts draw their invalid actions from the explorer's path, not TextWorldExpress's);
- ``random``: random actions, mostly valid ones, a share (``invalid_rate``) invalid (an action
  seen elsewhere in the game that does not apply here: a wall, an object in another room,
  a ``put`` before the ``take``), so the model reads what the game answers to mistakes;
- ``detour``: the gold path with detours of random actions inserted at random points; after a
  detour, the moves it made are walked back (TextWorldExpress exits are two-way) and the gold
  path resumes where it still applies (a gold action that no longer applies is repaired by one
  obvious action when there is one: open the door before ``move``, ``take`` before ``put``, and
  skipped otherwise). Where the gold path is the explorer's (coin, multi-room TWC) the rest is
  replanned instead: the explorer continues from the state the detour left (what is held and
  what is already in place is tracked from the transcript). TextWorldExpress itself cannot plan
  from an arbitrary state. ``success`` records whether the game was still won.

A transcript is stored as chat messages in the layout the policy sees (:mod:`eto_train.prompting`:
a system turn naming the game's action forms, ``Task: ...`` with the first observation, then
``Action: ...`` turns and observation turns), and rendered through the tokenizer's chat
template when it is tokenized, so pretraining and BC share one format. Unlike a BC example,
it ends on the observation that answers the last action.

Seeds (:func:`.positions.pretrain_seeds`) are positions in each game's list of valid seeds of a fold, as
the env splits are: the ``test`` fold (no split uses it) and the ``train``-fold positions that no
split of the env config uses (so BC's 500 training tasks stay its only data of those tasks),
never the ``dev`` fold (``unseen`` and ``test_unseen`` are drawn from it). A held-out set of
positions (``heldout``) is kept out of training for the probes and the held-out loss.

Generation is deterministic (every random choice comes from a ``random.Random`` seeded by the
transcript's identity) and streamed: tasks are shuffled once, cut into shards of
``shard_tasks`` tasks, and each shard is written whole (temporary file, then rename) as JSONL,
so a killed run keeps its finished shards and never holds more than one shard in memory.
"""

from __future__ import annotations

import json
import random
import re
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Iterable, Iterator

from ..store import write_json, write_jsonl
from .positions import FOLD_SIZE, FOLDS, SeedSets

KINDS = ("gold", "random", "detour")
DIRECTIONS = ("north", "south", "east", "west")
INVERSE = {"north": "south", "south": "north", "east": "west", "west": "east"}

_ROOM = re.compile(r"You are in the ([^.]+)\.")
_EXIT = re.compile(r"[Tt]o the (North|South|East|West) you see (?:a closed [^.]*door|the ([^.]+))\.")
_REVEAL = re.compile(r"revealing the ([^.]+)\.")

# Bumped when the same config yields other transcripts (a finished data folder of an older
# generator is then made again). 2: multi-room TWC's assignment from the game (twc_places).
GENERATOR_VERSION = 2


# -- settings and seeds ------------------------------------------------------------------------

@dataclass(frozen=True)
class Setting:
    """One game with one parameter string (a TextWorldExpress ``load``)."""

    game: str
    params: str = ""
    tasks: int | None = None  # cap on this setting's training tasks (a deterministic sample)

    @property
    def key(self) -> str:
        return f"{self.game}[{self.params}]"

    def param(self, name: str) -> str | None:
        for part in self.params.split(","):
            k, _, v = part.partition("=")
            if k.strip() == name:
                return v.strip()
        return None

    @property
    def walker_gold(self) -> bool:
        """True when the gold path is the seeded explorer's (see the module docstring): coin, and
        TWC with more than one room (TextWorldExpress's gold is deterministic in one room)."""
        return self.game == "coin" or (self.game == "twc" and self.param("numLocations") != "1")


def settings_of(raw: Iterable[dict[str, Any]], only_games: Iterable[str] | None = None) -> list[Setting]:
    """``pretrain.data.settings`` (``{game, params, tasks}`` entries) as settings; ``only_games``
    keeps those games only (a toy run's filter)."""
    from ..envs.twx_games import ACTION_FORMS

    keep = set(only_games) if only_games else None
    out, seen = [], set()
    for i, s in enumerate(raw):
        s = dict(s)
        game = s.get("game")
        if game not in ACTION_FORMS:
            raise ValueError(f"pretrain.data.settings[{i}].game: {game!r} is not a TextWorldExpress game "
                             f"({sorted(ACTION_FORMS)})")
        unknown = set(s) - {"game", "params", "tasks"}
        if unknown:
            raise ValueError(f"pretrain.data.settings[{i}]: unknown keys {sorted(unknown)} (game, params, tasks)")
        setting = Setting(game, str(s.get("params") or ""), s.get("tasks"))
        if setting.key in seen:
            raise ValueError(f"pretrain.data.settings[{i}]: {setting.key} is listed twice")
        seen.add(setting.key)
        if keep is None or game in keep:
            out.append(setting)
    if not out:
        raise ValueError("pretrain.data.settings: no setting left (check pretrain.data.only_games)")
    return out


# -- playing -------------------------------------------------------------------------------------

@dataclass(frozen=True)
class GenConfig:
    """How transcripts are played (``pretrain.data.play``)."""

    max_steps: int = 40            # cap on actions per transcript
    random_steps: int = 20         # actions of a random transcript (it may end sooner)
    invalid_rate: float = 0.2      # share of random / detour actions drawn among invalid ones
    max_detours: int = 2           # detours per detour transcript (1..max_detours)
    detour_len: int = 3            # actions per detour (1..detour_len)


class _Play:
    """One transcript being played: messages, actions and what the game answered."""

    def __init__(self, env, task, prompt, rng: random.Random, gold: list[str], record_valid: bool,
                 assignment: dict[str, str] | None = None):
        from ..prompting import first_user_message, system_message

        self.env, self.rng, self.prompt, self.record_valid = env, rng, prompt, record_valid
        instruction, first = env.reset(task)
        self.messages = [system_message(prompt, env.action_forms(task.game)),
                         first_user_message(prompt, instruction, first.observation)]
        self.actions: list[str] = []
        self.valid: list[bool] = []
        self.valid_lists: list[list[str]] = []
        self.now = sorted(first.valid_actions or [])
        # actions that exist somewhere in this game: the pool invalid actions are drawn from
        self.seen = set(self.now) | set(gold) | {f"move {d}" for d in DIRECTIONS}
        self.done, self.success = first.done, first.success
        # what the transcript says about the world, for the explorer (walk)
        self.assignment = dict(assignment or {})     # object -> where it belongs (TWC)
        self.room: str | None = None
        self.neighbors: dict[tuple[str, str], str] = {}  # (room, direction) -> room seen there
        self.closed: set[tuple[str, str]] = set()        # doors seen closed
        self.held: set[str] = set()
        self.placed: set[str] = set()
        self._observe(first.observation, None)

    def _observe(self, obs: str, action: str | None) -> None:
        m = _ROOM.search(obs)
        if m and (action is None or action == "look around" or action.startswith("move ")):
            self.room = m.group(1)
            for d, name in _EXIT.findall(obs):
                d = d.lower()
                if name:
                    self.neighbors[(self.room, d)] = name
                    self.closed.discard((self.room, d))
                else:
                    self.closed.add((self.room, d))
        if action is None or self.room is None:
            return
        if action.startswith("open door to ") and obs.startswith(("You open", "That is already open")):
            d = action.rsplit(" ", 1)[1]
            self.closed.discard((self.room, d))
            if (r := _REVEAL.search(obs)):
                self.neighbors[(self.room, d)] = r.group(1)
        elif action.startswith("close door to ") and obs.startswith("You close"):
            self.closed.add((self.room, action.rsplit(" ", 1)[1]))
        elif action.startswith("take ") and obs.startswith("You take"):
            obj = action[len("take "):]
            self.held.add(obj)
            self.placed.discard(obj)
        elif action.startswith("put ") and " in " in action and obs.startswith("You put"):
            obj, _, where = action[len("put "):].rpartition(" in ")
            self.held.discard(obj)
            if self.assignment.get(obj) == where:
                self.placed.add(obj)

    def step(self, action: str) -> bool:
        """Play ``action``; True when it was valid."""
        from ..prompting import format_action, render_observation

        valid = action in self.now
        if self.record_valid:
            self.valid_lists.append(self.now)
        res = self.env.step(action)
        self.actions.append(action)
        self.valid.append(valid)
        self.messages.append({"role": "assistant", "content": format_action(action)})
        self.messages.append({"role": "user", "content": render_observation(self.prompt, res.observation)})
        self.now = sorted(res.valid_actions or [])
        self.seen.update(self.now)
        self.done, self.success = res.done, res.success
        self._observe(res.observation, action)
        return valid

    def random_action(self, invalid_rate: float) -> str:
        if self.rng.random() < invalid_rate:
            pool = sorted(self.seen - set(self.now))
            if pool:
                return self.rng.choice(pool)
        return self.rng.choice(self.now) if self.now else "look around"


def _play_gold_action(p: _Play, action: str) -> str:
    """Play one gold action after a detour: as it is, after one repair, or not at all.
    Returns what happened: played, repaired or skipped."""
    if action in p.now:
        p.step(action)
        return "played"
    words = action.split()
    fix = None
    if words[:1] == ["move"] and len(words) == 2 and f"open door to {words[1]}" in p.now:
        fix = f"open door to {words[1]}"
    elif words[:1] == ["put"] and " in " in action:
        obj = action[len("put "):action.rindex(" in ")]
        if f"take {obj}" in p.now:
            fix = f"take {obj}"
    if fix is not None:
        p.step(fix)
        if not p.done and action in p.now:
            p.step(action)
            return "repaired"
    return "skipped"


def _work(p: _Play, game: str) -> bool:
    """The explorer's work in the current room: coin: take the coin; TWC: take the task's objects
    that lie here, put what is held where it belongs (opening the container first). True when
    the game is over."""
    if game == "coin":
        if "take coin" in p.now:
            p.step("take coin")
        return p.done
    for obj in sorted(p.assignment):
        if p.done:
            return True
        if obj not in p.held and obj not in p.placed and f"take {obj}" in p.now:
            p.step(f"take {obj}")
    for obj in sorted(p.held):
        where = p.assignment.get(obj)
        if p.done or where is None:
            continue
        put = f"put {obj} in {where}"
        if put not in p.now and f"open {where}" in p.now:
            p.step(f"open {where}")
        if not p.done and put in p.now:
            p.step(put)
    return p.done


def _go(p: _Play, d: str, visited: set[str]) -> bool:
    """Move through exit ``d`` (opening its door first); True when the room changed."""
    here = p.room
    if (here, d) in p.closed and f"open door to {d}" in p.now:
        p.step(f"open door to {d}")
        if p.done or p.neighbors.get((here, d)) in visited:
            return False
    if p.done or f"move {d}" not in p.now:
        return False
    p.step(f"move {d}")
    return p.room != here


def walk(p: _Play, game: str, rng: random.Random, max_steps: int, passes: int = 3) -> None:
    """The seeded explorer: depth-first over the rooms (exits in a random order of ``rng``),
    doing :func:`_work` in every room it enters, walking back when a room has no new exit;
    a second pass if the work is not done (objects found late whose place was passed before).
    Stops when the game is over or after ``max_steps`` actions in the transcript."""
    def room_full() -> bool:
        return p.done or len(p.actions) >= max_steps

    for _ in range(passes):
        if _work(p, game) or room_full() or p.room is None:
            return
        visited, stack, order = {p.room}, [], {}
        while not room_full():
            here = p.room
            if here not in order:
                exits = [d for d in DIRECTIONS if f"move {d}" in p.now]
                rng.shuffle(exits)
                order[here] = exits
            moved = False
            while order[here] and not room_full():
                d = order[here].pop()
                if p.neighbors.get((here, d)) in visited:
                    continue
                if not _go(p, d, visited):
                    continue
                if p.room in visited:  # a way round to a room already seen: straight back
                    _go(p, INVERSE[d], set())
                    continue
                visited.add(p.room)
                stack.append(d)
                moved = True
                break
            if moved:
                if _work(p, game):
                    return
                continue
            if not stack:
                break  # every room of this pass seen
            _go(p, INVERSE[stack.pop()], set())
            if _work(p, game):
                return


def twc_assignment(gold: list[str]) -> dict[str, str]:
    """Where each object of a TWC task belongs, read off TextWorldExpress's gold path (one-room
    TWC only: in several rooms that path, and so this, can change from call to call)."""
    out = {}
    for a in gold:
        if a.startswith("put ") and " in " in a:
            obj, _, where = a[len("put "):].rpartition(" in ")
            out[obj] = where
    return out


def gold_path(env, task, setting: Setting, rng: random.Random, prompt, max_steps: int
              ) -> tuple[list[str], dict[str, str], str]:
    """(gold actions, TWC assignment, source): TextWorldExpress's gold path, or for coin and
    multi-room TWC the seeded explorer's path (played once here to record it), with the TWC
    assignment read from the game (``env.twc_places``: the nearest valid container). Nothing
    of TextWorldExpress's gold path reaches the explorer's settings: it is not even asked for."""
    if not setting.walker_gold:
        twx = env.expert_actions(task)
        return twx, (twc_assignment(twx) if setting.game == "twc" else {}), "twx"
    assignment = {}
    if setting.game == "twc":
        assignment = {obj: places[0] for obj, places in env.twc_places(task).items() if places}
    p = _Play(env, task, prompt, rng, [], False, assignment)
    p.step("look around")
    walk(p, setting.game, rng, max_steps)
    return p.actions, assignment, "explorer"


def play(env, task, kind: str, gold: list[str], rng: random.Random, gen: GenConfig, prompt,
         record_valid: bool = False, assignment: dict[str, str] | None = None,
         replan: str | None = None) -> dict[str, Any]:
    """Play one transcript of ``kind`` on ``task``; the row written to the shard (no identity).
    ``replan`` (coin or twc: the explorer's games) replans after a detour instead of resuming."""
    p = _Play(env, task, prompt, rng, gold, record_valid, assignment)
    extra: dict[str, Any] = {}
    if kind == "gold":
        for a in gold:
            if p.done or len(p.actions) >= gen.max_steps:
                break
            p.step(a)
    elif kind == "random":
        for _ in range(min(gen.random_steps, gen.max_steps)):
            if p.done:
                break
            p.step(p.random_action(gen.invalid_rate))
    elif kind == "detour":
        n = rng.randint(1, max(1, gen.max_detours))
        points = set(rng.sample(range(len(gold)), min(n, len(gold)))) if gold else set()
        outcome: Counter = Counter()
        detour_steps = 0
        for i, a in enumerate(gold):
            if p.done or len(p.actions) >= gen.max_steps:
                break
            if i in points:
                moved = []
                for _ in range(rng.randint(1, max(1, gen.detour_len))):
                    if p.done or len(p.actions) >= gen.max_steps:
                        break
                    act = p.random_action(gen.invalid_rate)
                    detour_steps += 1
                    if p.step(act) and act.startswith("move ") and act[5:] in INVERSE:
                        moved.append(act[5:])
                for d in reversed(moved):  # walk the detour's moves back
                    back = f"move {INVERSE[d]}"
                    if p.done or len(p.actions) >= gen.max_steps or back not in p.now:
                        break
                    p.step(back)
                    detour_steps += 1
                if p.done or len(p.actions) >= gen.max_steps:
                    break
                if replan is not None:  # the explorer takes over from the state the detour left
                    walk(p, replan, rng, gen.max_steps)
                    outcome["replanned"] += 1
                    break
            outcome[_play_gold_action(p, a)] += 1
        extra = {"detour_steps": detour_steps, "gold_played": outcome["played"],
                 "gold_repaired": outcome["repaired"], "gold_skipped": outcome["skipped"],
                 "replanned": outcome["replanned"]}
    else:
        raise ValueError(f"unknown transcript kind {kind!r} (one of {KINDS})")
    row = {"messages": p.messages, "actions": p.actions, "valid": p.valid,
           "success": bool(p.success), "done": bool(p.done), **extra}
    if record_valid:
        row["valid_actions"] = p.valid_lists
    return row


# -- the plan: which tasks, in which shard -------------------------------------------------------

def plan_jobs(settings: list[Setting], seeds: SeedSets, seed: int, max_tasks: int | None = None
              ) -> tuple[list[tuple[int, str, int]], list[tuple[int, str, int]]]:
    """(training jobs, held-out jobs), each ``(setting index, fold, position)``.

    A setting's training tasks are all its positions, or a deterministic sample of
    ``tasks`` (or ``max_tasks``) of them; the training jobs are shuffled once, so every shard
    mixes the games. Held-out jobs keep their order.
    """
    train: list[tuple[int, str, int]] = []
    heldout: list[tuple[int, str, int]] = []
    for i, s in enumerate(settings):
        pool = [(f, p) for f in sorted(seeds.train) for p in seeds.train[f]]
        cap = min(c for c in (s.tasks, max_tasks, len(pool)) if c is not None)
        if cap < len(pool):
            pool = sorted(random.Random(f"{seed}/tasks/{s.key}").sample(pool, cap))
        train += [(i, f, p) for f, p in pool]
        heldout += [(i, f, p) for f in sorted(seeds.heldout) for p in seeds.heldout[f]]
    random.Random(f"{seed}/shuffle").shuffle(train)
    return train, heldout


def shard_specs(jobs: list[tuple[int, str, int]], shard_tasks: int, prefix: str) -> list[tuple[str, list]]:
    """``(file name, jobs)`` of each shard."""
    n = max(1, int(shard_tasks))
    return [(f"{prefix}-{k // n:05d}.jsonl", jobs[k:k + n]) for k in range(0, len(jobs), n)]


# -- one shard (runs in a worker process or in the stage's own) -------------------------------

_ENVS: dict[str, Any] = {}  # one adapter per setting in this process (all in one shared JVM)


def _env_of(setting: Setting, step_limit: int):
    from ..envs.textworld_express import TextWorldExpressEnv

    if setting.key not in _ENVS:
        _ENVS[setting.key] = TextWorldExpressEnv(
            games=[{"name": setting.game, "params": setting.params}],
            splits={f"all_{f}": {"fold": f, "start": 0, "count": FOLD_SIZE} for f in FOLDS},
            step_limit=step_limit)
    return _ENVS[setting.key]


def task_of(setting: Setting, fold: str, position: int, step_limit: int = 40):
    """The TextWorldExpress task at ``position`` of ``fold``'s valid seeds for ``setting``."""
    return _env_of(setting, step_limit).tasks(f"all_{fold}")[position]


def close_envs() -> None:
    for env in _ENVS.values():
        env.close()
    _ENVS.clear()


def transcripts_of_task(setting: Setting, fold: str, position: int, kinds: dict[str, int],
                        gen: GenConfig, prompt, salt: str, record_valid: bool = False) -> list[dict[str, Any]]:
    """Every transcript of one task: ``kinds[k]`` of each kind ``k``, in ``KINDS`` order."""
    env = _env_of(setting, gen.max_steps)
    task = env.tasks(f"all_{fold}")[position]
    base = f"{setting.key}/{fold}/{task.seed}"
    gold, assignment, source = gold_path(env, task, setting, random.Random(f"{salt}/{base}/gold-path"),
                                         prompt, gen.max_steps)
    replan = setting.game if setting.walker_gold else None
    rows = []
    for kind in KINDS:
        for sample in range(int(kinds.get(kind, 0))):
            ident = f"{base}/{kind}/{sample}"
            rng = random.Random(f"{salt}/{ident}")
            row = play(env, task, kind, gold, rng, gen, prompt, record_valid, assignment, replan)
            rows.append({"id": ident, "game": setting.game, "params": setting.params, "fold": fold,
                         "position": position, "seed": task.seed, "kind": kind, "sample": sample,
                         "gold_length": len(gold), "gold_source": source, **row})
    return rows


def row_stats(rows: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """Counts of a shard: transcripts, actions, invalid actions, wins and characters, by kind and game."""
    by_kind: dict[str, Counter] = {}
    by_game: dict[str, Counter] = {}
    for r in rows:
        chars = sum(len(m["content"]) for m in r["messages"])
        for table, key in ((by_kind, r["kind"]), (by_game, r["game"])):
            c = table.setdefault(key, Counter())
            c["transcripts"] += 1
            c["actions"] += len(r["actions"])
            c["invalid_actions"] += sum(1 for v in r["valid"] if not v)
            c["won"] += int(r["success"])
            c["chars"] += chars
    return {"by_kind": {k: dict(v) for k, v in by_kind.items()},
            "by_game": {k: dict(v) for k, v in by_game.items()}}


def merge_stats(parts: Iterable[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, dict[str, Counter]] = {"by_kind": {}, "by_game": {}}
    for part in parts:
        for table in out:
            for key, counts in part.get(table, {}).items():
                out[table].setdefault(key, Counter()).update(counts)
    return {t: {k: dict(sorted(v.items())) for k, v in sorted(rows.items())} for t, rows in out.items()}


def write_shard(spec: dict[str, Any]) -> dict[str, Any]:
    """Play a shard's tasks and write the shard (whole, atomically) with its stats beside it.
    ``spec``: path, jobs, settings, kinds, gen, prompt, salt, record_valid (plain data, so that
    a worker process can take it)."""
    from ..prompting import PromptConfig

    settings = [Setting(**s) for s in spec["settings"]]
    gen, prompt = GenConfig(**spec["gen"]), PromptConfig(**spec["prompt"])
    rows = []
    for i, fold, pos in spec["jobs"]:
        rows += transcripts_of_task(settings[i], fold, pos, spec["kinds"], gen, prompt, spec["salt"],
                                    spec["record_valid"])
    stats = {"rows": len(rows), **row_stats(rows)}
    path = Path(spec["path"])
    write_json(path.with_suffix(".stats.json"), stats)  # first: a shard that exists has its stats
    write_jsonl(path, rows)
    return stats


# -- the whole data set ------------------------------------------------------------------------

def generate(out_dir: str | Path, settings: list[Setting], seeds: SeedSets, kinds: dict[str, int],
             gen: GenConfig, prompt_cfg: dict[str, Any], seed: int, shard_tasks: int,
             heldout_kinds: dict[str, int] | None = None, max_tasks: int | None = None,
             workers: int = 1, resume: bool = False, console=None) -> dict[str, Any]:
    """Write the training and held-out shards into ``out_dir``; returns the data set's summary.

    With ``resume`` (an interrupted run of the same config) finished shards are kept; otherwise
    old shards are removed first. ``workers`` > 1 plays shards in that many processes (one JVM
    each); the shards are the same whatever the number of workers.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if not resume:
        for old in [*out.glob("*.jsonl"), *out.glob("*.stats.json")]:
            old.unlink()
    train_jobs, heldout_jobs = plan_jobs(settings, seeds, seed, max_tasks)
    common = {"settings": [asdict(s) for s in settings], "gen": asdict(gen), "prompt": dict(prompt_cfg),
              "salt": str(seed)}
    specs = [{**common, "path": str(out / name), "jobs": jobs, "kinds": kinds, "record_valid": False}
             for name, jobs in shard_specs(train_jobs, shard_tasks, "train")]
    specs += [{**common, "path": str(out / name), "jobs": jobs, "kinds": heldout_kinds or kinds,
               "record_valid": True}
              for name, jobs in shard_specs(heldout_jobs, shard_tasks, "heldout")]
    todo = [s for s in specs if not Path(s["path"]).exists()]
    if console is not None and len(todo) < len(specs):
        console.print(f"[pretrain/data] resuming: {len(specs) - len(todo)} of {len(specs)} shards already written")
    _run_shards(todo, workers, console)
    shards = []
    for s in specs:
        path = Path(s["path"])
        stats = json.loads(path.with_suffix(".stats.json").read_text())
        shards.append({"file": path.name, "part": path.name.split("-")[0], "tasks": len(s["jobs"]),
                       **stats})
    parts = {part: merge_stats(x for x in shards if x["part"] == part) for part in ("train", "heldout")}
    return {"shards": [{k: s[k] for k in ("file", "part", "tasks", "rows")} for s in shards],
            "train": {"tasks": len(train_jobs), "transcripts": sum(s["rows"] for s in shards if s["part"] == "train"),
                      **parts["train"]},
            "heldout": {"tasks": len(heldout_jobs),
                        "transcripts": sum(s["rows"] for s in shards if s["part"] == "heldout"),
                        **parts["heldout"]}}


def _run_shards(todo: list[dict[str, Any]], workers: int, console) -> None:
    if not todo:
        return
    done = 0
    if workers <= 1:
        for spec in todo:
            write_shard(spec)
            done += 1
            if console is not None:
                console.print(f"[pretrain/data] shard {done}/{len(todo)}: {Path(spec['path']).name}")
        close_envs()
        return
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor, as_completed

    with ProcessPoolExecutor(max_workers=workers, mp_context=mp.get_context("spawn")) as pool:
        futures = {pool.submit(write_shard, spec): spec for spec in todo}
        for fut in as_completed(futures):
            fut.result()
            done += 1
            if console is not None:
                console.print(f"[pretrain/data] shard {done}/{len(todo)}: {Path(futures[fut]['path']).name}")


def shard_files(data_dir: str | Path, part: str) -> list[Path]:
    """The finished shards of ``part`` (train or heldout), in order."""
    return sorted(Path(data_dir).glob(f"{part}-*.jsonl"))


def read_transcripts(paths: Iterable[str | Path]) -> Iterator[dict[str, Any]]:
    """Transcripts of the shards, one at a time (a shard's lines are streamed, not loaded whole)."""
    for path in paths:
        with open(path, encoding="utf-8") as f:
            for line in f:
                if line.strip():
                    yield json.loads(line)


def render(tokenizer, messages: list[dict[str, str]]) -> str:
    """A transcript as text, through the tokenizer's chat template (what the model trains on)."""
    return tokenizer.apply_chat_template(messages, tokenize=False)
