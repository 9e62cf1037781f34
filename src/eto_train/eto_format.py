"""The ETO authors' data formats, both ways: SFT conversations and preference pairs.

The released files (repository Yifan-Song793/ETO: ``data/<env>_sft.json``, read by
``fastchat/train/train.py``; ``construct_preference.py`` writes the pairs that
``fastchat/train/train_dpo.py`` reads) are ShareGPT conversations of ``from: human|gpt`` turns:

- SFT: ``{"id", "conversations": [human instruction, gpt "OK", human task, gpt "Thought: ...
  Action: ...", human "Observation: ...", ..., gpt]}``; ALFWorld entries also carry
  ``game_file`` (its last folder is the trial, the key the authors pair on); WebShop's a
  ``reward``.
- Pairs: ``{"id", "prompt": [instruction, "OK", task], "chosen": [gpt, human, ..., gpt],
  "rejected": [...]}``.
- Evaluation outputs (``eval_agent/main.py``; what ``construct_preference.py`` reads as the
  explorations): one ``<task id>.json`` per task, ``{"meta": {..., "reward"}, "conversations"}``;
  :func:`to_eval_output` and :func:`write_eval_outputs` (``export.format=eto_eval``).

AgentGym's AgentTraj (``{"item_id": "webshop_12", "conversations": [{"from", "loss", "value"}, ...]}``,
its instruction answered "Ok.") is the same conversation under another id: :func:`from_agenttraj`
reads it into the authors' layout (the readers below take either, entry by entry) and
:func:`to_agenttraj` writes it (``export.format=agenttraj``). Its ``item_id`` is
``<AgentGym environment>_<task index>``: :func:`agenttraj_id`.

The instruction + "OK" opening becomes this project's ``Episode.system`` with
``opening="instruction_ok"`` (ETO has no system role); a project episode with a system turn is
written with that opening. The conversions are pure data; the readers at the end
(:func:`read_eto_file`, :func:`import_experts`, :func:`read_eto_pairs`) read the authors' files
(a JSON list, or JSON Lines) and name the file, the line (or list item) and the field of a bad
entry.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any, Iterable, Iterator

from .layout import CONFIGS
from .prompting import OK, parse_action
from .records import Episode, PolicyRef, RecordError, Step, context_length, episode_key, to_messages
from .store import read_jsonl

ALFWORLD_DATA_ROOT = "json_2.1.1"  # ALFWorld's data folder, the prefix of the authors' game_file


# -- conversations ------------------------------------------------------------------------------
def to_sharegpt(msgs: list[dict[str, str]]) -> list[dict[str, str]]:
    """Chat messages as ETO turns: a system turn becomes the instruction turn answered "OK"."""
    conv = []
    for m in msgs:
        if m["role"] == "system":
            conv += [{"from": "human", "value": m["content"]}, {"from": "gpt", "value": OK}]
        else:
            conv.append({"from": "human" if m["role"] == "user" else "gpt", "value": m["content"]})
    return conv


def from_sharegpt(conv: list[dict[str, str]]) -> list[dict[str, str]]:
    return [{"role": "user" if t["from"] == "human" else "assistant", "content": t["value"]} for t in conv]


def _check_turns(conv: Any, name: str = "conversations") -> None:
    if not isinstance(conv, list) or not conv:
        raise ValueError(f"'{name}' must be a non-empty list")
    for i, turn in enumerate(conv):
        if not isinstance(turn, dict) or turn.get("from") not in ("human", "gpt"):
            raise ValueError(f"{name}[{i}].from must be 'human' or 'gpt', got "
                             f"{turn.get('from') if isinstance(turn, dict) else turn!r}")
        if not isinstance(turn.get("value"), str):
            raise ValueError(f"{name}[{i}].value must be a string")
        if i and turn["from"] == conv[i - 1]["from"]:
            raise ValueError(f"{name}[{i}]: two {turn['from']} turns in a row")


def has_opening(conv: list[dict[str, str]]) -> bool:
    """The released opening: an instruction turn answered "OK", then the task turn."""
    return (len(conv) >= 3 and conv[0]["from"] == "human" and conv[1]["from"] == "gpt"
            and conv[1]["value"].strip() == OK and conv[2]["from"] == "human")


# -- SFT trajectories ---------------------------------------------------------------------------
def eto_id(ep: Episode) -> str:
    """The id the authors' tools key on: ScienceWorld ``<task number>_<variation>``, WebShop the
    goal index, ALFWorld the trial folder (``game_file`` carries the whole path); any other id in
    its file-safe form (:func:`file_safe`: TWX's ``mapreader/train/7`` is ``mapreader+2Ftrain+2F7``),
    the name of its evaluation-output file, which their ``construct_preference.py`` keys the
    explorations on: the gold file (``format=eto``) and the explorations (``format=eto_eval``) then
    match as they are. The import maps it back (:func:`task_index`)."""
    return ep.task_id.rsplit("/", 1)[-1] if ep.env == "alfworld" else file_safe(ep.task_id)


def to_eto(ep: Episode, id: str | None = None) -> dict[str, Any]:
    """One episode in the released SFT layout (the opening turns first, then the trajectory)."""
    msgs = to_messages(ep)
    if ep.opening == "system" and not ep.system:  # no instruction on record: keep the opening's shape
        msgs = [{"role": "system", "content": ""}] + msgs
    out: dict[str, Any] = {"id": id or eto_id(ep), "conversations": to_sharegpt(msgs), "reward": ep.final_score}
    if ep.env == "alfworld":
        out["game_file"] = f"{ALFWORLD_DATA_ROOT}/{ep.fold}/{ep.task_id}"
    return out


def from_eto(obj: Any, env: str = "eto-import", split: str = "train") -> Episode:
    """One trajectory of the released SFT layout (or a bare conversation without the opening).

    The instruction + "OK" opening becomes ``system`` (``opening="instruction_ok"``), the next
    human turn the task turn, each gpt turn a step (thoughts kept in ``raw_output``) and each
    later human turn its observation, exactly as written. The reward is the entry's ``reward``
    (1.0 when absent), kept as the file says; the pair rule may read it otherwise
    (``eto.pairs.expert_reward=authors``, the paper profiles: 1.0 in ScienceWorld and ALFWorld,
    as the authors' construct_preference.py; see ``pairs.pairing_reward``).
    """
    if not isinstance(obj, dict) or "conversations" not in obj:
        raise ValueError("expected an object with a 'conversations' list")
    conv = obj["conversations"]
    _check_turns(conv)
    if conv[0]["from"] != "human":
        raise ValueError("conversations[0] must be a human turn (the instruction)")
    opening = has_opening(conv)
    start = 2 if opening else 0
    if not any(t["from"] == "gpt" for t in conv[start + 1:]):
        raise ValueError("the trajectory has no gpt (assistant) turn" + (" after the opening" if opening else ""))
    steps: list[Step] = []
    for i in range(start + 1, len(conv)):
        turn = conv[i]
        if turn["from"] != "gpt":
            continue
        action = parse_action(turn["value"])
        if action is None and re.search(r"(?im)^\s*action\s*:\s*$", turn["value"]):
            raise ValueError(f"conversations[{i}].value: empty action ('Action:' with nothing after it)")
        obs = conv[i + 1]["value"] if i + 1 < len(conv) else ""
        steps.append(Step(index=len(steps), raw_output=turn["value"], action=action,
                          valid=action is not None, observation=obs, reward=0.0, done=False))
    reward = obj.get("reward", 1.0)
    if not isinstance(reward, (int, float)) or isinstance(reward, bool):
        raise ValueError(f"reward: expected a number, got {reward!r}")
    steps[-1].reward, steps[-1].done = float(reward), True
    tid = obj.get("id", obj.get("game_file"))
    if tid is None:
        raise ValueError("no 'id' (or ALFWorld 'game_file') to name the task")
    tid = str(tid)
    ep = Episode(episode_id=episode_key("expert", tid, 0, 0), task_id=tid, env=env, game="",
                 fold="", seed=0, split=split, env_version="imported",
                 policy=PolicyRef(id="expert"), prompt_version="eto-released",
                 system=conv[0]["value"] if opening else "", opening="instruction_ok" if opening else "system",
                 first_user=conv[start]["value"], instruction=conv[start]["value"],
                 first_observation="", steps=steps)
    success = obj.get("success", float(reward) >= 1.0)
    ep.finish("success" if success else "failure")
    return ep


def task_index(tasks: Iterable[Any]) -> dict[str, Any]:
    """Lookup of environment tasks by every id the authors' files may use for them."""
    index: dict[str, Any] = {}
    for t in tasks:
        index[t.task_id] = t
        index.setdefault(file_safe(t.task_id), t)  # eto_id's form of an id with '/' (TWX), as the export writes it
        index.setdefault(agenttraj_id(t), t)  # AgentTraj's item_id (an AgentGym task's is its task_id)
        if t.env == "alfworld":
            index.setdefault(t.task_id.rsplit("/", 1)[-1], t)  # the trial folder alone
        if t.env == "sciworld":
            # the task-name form <task name>_<variation>: the environment numbers its tasks by the
            # shipped taskname2id.json (envs/scienceworld.py), so <name>_<v> and <number>_<v> are one task
            index.setdefault(f"{t.game}_{t.seed}", t)
    return index


_ID_FORMS = (("alfworld", re.compile(r"(^|/)trial_[^/]+(/game\.tw-pddl)?$")),
             ("sciworld", re.compile(r"^(\d+|task-.+)_\d+$")),
             ("webshop", re.compile(r"^(fixed_)?\d+$")))


def guess_env(ids: Iterable[str]) -> str | None:
    """The environment whose id form all of ``ids`` have (the authors' ids: ALFWorld ``game_file``
    trials, ScienceWorld ``<number|name>_<variation>``, WebShop goal indices), for error messages."""
    ids = [str(i) for i in ids]
    for env, form in _ID_FORMS:
        if ids and all(form.search(i) for i in ids):
            return env
    prefixes = {m.group(1) if m else None for m in (re.fullmatch(r"([a-z]+)_\d+", i) for i in ids)}
    if len(prefixes) == 1 and None not in prefixes:  # AgentTraj's <environment>_<index>
        return prefixes.pop()
    return None


def match_task(obj: dict[str, Any], index: dict[str, Any]) -> Any | None:
    """The environment task an imported entry belongs to (None: no such task).

    ScienceWorld ``<task number>_<variation>`` and WebShop goal indices are this project's ids;
    a ScienceWorld id in task-name form (``task-2a-test-conductivity-of-unknown-substances_456``)
    is the same task under its ``taskname2id.json`` number (``10_456``);
    ALFWorld's ``game_file`` (``.../<task folder>/<trial>[/game.tw-pddl]``) is matched on its
    ``<task folder>/<trial>``, then on the trial alone.
    """
    if "game_file" in obj:
        parts = [p for p in str(obj["game_file"]).split("/") if p and not p.startswith("game.tw")]
        for key in ("/".join(parts[-2:]), parts[-1] if parts else ""):
            if key in index:
                return index[key]
    return index.get(str(obj.get("id")))


def bind_task(ep: Episode, task: Any, env_version: str) -> Episode:
    """An imported episode under the environment task it belongs to."""
    ep.task_id, ep.env, ep.game, ep.fold, ep.seed, ep.split = (
        task.task_id, task.env, task.game, task.fold, task.seed, task.split)
    ep.episode_id = episode_key("expert", task.task_id, 0, task.seed)
    ep.env_version = f"imported; {env_version}"  # experts.IMPORTED prefix
    return ep


# -- AgentGym's AgentTraj -------------------------------------------------------------------------
AGENTGYM_ENV = "agentgym"  # the registry name of envs/agentgym.py: its task ids are AgentGym's item ids
_AGENTTRAJ_OK = "Ok."  # AgentGym's answer to the instruction turn


def agenttraj_id(task: Any) -> str:
    """The ``item_id`` of a task (or episode) in AgentTraj: ``<AgentGym env>_<index>``. A task played
    through an AgentGym server has it as its id (``webshop_12``); WebShop's own adapter numbers goals as
    AgentGym's WebShop server does (``webshop_<goal index>``); any other is ``<env>_<task id>`` (an index
    of AgentGym's ALFWorld or SciWorld server is not one of this project's tasks there: such ids are
    reported unmatched, never bound to a wrong task)."""
    return task.task_id if task.env == AGENTGYM_ENV else f"{task.env}_{task.task_id}"


def is_agenttraj(obj: Any) -> bool:
    return isinstance(obj, dict) and "item_id" in obj and "id" not in obj


def from_agenttraj(obj: Any) -> dict[str, Any]:
    """One AgentTraj entry in the authors' SFT layout (``id``, conversations without ``loss``; its
    "Ok." opening is the "OK" one: every turn is kept, the instruction becomes ``Episode.system``)."""
    item = obj.get("item_id")
    if not isinstance(item, str) or not re.fullmatch(r".+_\S+", item):
        raise ValueError(f"item_id: expected '<environment>_<index>' such as 'webshop_12', got {item!r}")
    conv = obj.get("conversations")
    if not isinstance(conv, list) or not conv:
        raise ValueError("'conversations' must be a non-empty list")
    turns = []
    for i, t in enumerate(conv):
        if not isinstance(t, dict):
            raise ValueError(f"conversations[{i}] must be an object {{from, loss, value}}, got {t!r:.60}")
        turns.append({k: t.get(k) for k in ("from", "value")})
    if len(turns) > 1 and turns[1]["from"] == "gpt" and isinstance(turns[1]["value"], str) \
            and turns[1]["value"].strip() == _AGENTTRAJ_OK:
        turns[1]["value"] = OK
    return {"id": item, "conversations": turns, **{k: obj[k] for k in ("reward", "success") if k in obj}}


def as_authors(obj: Any) -> Any:
    """An entry of either layout in the authors' (AgentTraj's converted, anything else as it is)."""
    return from_agenttraj(obj) if is_agenttraj(obj) else obj


def to_agenttraj(ep: Episode, id: str | None = None) -> dict[str, Any]:
    """One episode in AgentTraj's layout: what AgentGym's BC trainer reads (``loss`` true on the
    policy's turns, false on the opening's answer, null on the human turns)."""
    conv = to_eto(ep)["conversations"]
    opening = has_opening(conv)
    out = []
    for i, t in enumerate(conv):
        if t["from"] == "human":
            out.append({"from": "human", "loss": None, "value": t["value"]})
        elif opening and i == 1:
            out.append({"from": "gpt", "loss": False, "value": _AGENTTRAJ_OK})
        else:
            out.append({"from": "gpt", "loss": True, "value": t["value"]})
    return {"item_id": id or agenttraj_id(ep), "conversations": out, "reward": ep.final_score}


# -- preference pairs -------------------------------------------------------------------------
def pair_to_eto(pair: Any, id: str | None = None) -> dict[str, Any]:
    """A pair in the layout of the authors' ``construct_preference.py`` / ``train_dpo.py``."""
    prompt = pair.prompt
    if not prompt or prompt[0]["role"] not in ("system",) and not (
            len(prompt) >= 3 and prompt[1] == {"role": "assistant", "content": OK}):
        prompt = [{"role": "system", "content": ""}] + prompt  # keep the opening's shape
    return {"id": id or pair.task_id, "prompt": to_sharegpt(prompt),
            "chosen": to_sharegpt(pair.chosen), "rejected": to_sharegpt(pair.rejected)}


def pair_from_eto(obj: Any) -> dict[str, Any]:
    """``{id, prompt, chosen, rejected}`` as chat messages from the authors' pair layout."""
    if not isinstance(obj, dict):
        raise ValueError(f"a pair must be a JSON object, got {type(obj).__name__}")
    missing = sorted({"id", "prompt", "chosen", "rejected"} - set(obj))
    if missing:
        raise ValueError(f"missing field(s) {missing}")
    for side in ("prompt", "chosen", "rejected"):
        _check_turns(obj[side], side)
    if obj["prompt"][-1]["from"] != "human":
        raise ValueError("prompt: must end on a human turn (the task)")
    for side in ("chosen", "rejected"):
        if obj[side][0]["from"] != "gpt" or obj[side][-1]["from"] != "gpt":
            raise ValueError(f"{side}: must start and end on a gpt turn")
    return {"id": str(obj["id"]), **{k: from_sharegpt(obj[k]) for k in ("prompt", "chosen", "rejected")}}


# -- reading the authors' files ----------------------------------------------------------------
def _json_items(path: Path) -> Iterator[tuple[str, Any]]:
    """(location, object) for a JSON Lines file (``path:line``) or a JSON list (``path:line [item i]``)."""
    if path.suffix == ".jsonl":
        for lineno, obj in read_jsonl(path):
            yield f"{path}:{lineno}", obj
        return
    if not path.exists():
        raise FileNotFoundError(f"{path}: no such file")
    data = path.read_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[:exc.start].count(b"\n") + 1
        raise RecordError(f"{path}:{line}: not valid UTF-8 ({exc.reason} at byte {exc.start})") from None
    try:
        items = json.loads(text)
    except json.JSONDecodeError as exc:
        raise RecordError(f"{path}:{exc.lineno}: malformed JSON: {exc.msg} at column {exc.colno}") from None
    if not isinstance(items, list):
        raise RecordError(f"{path}: expected a JSON list of trajectories, got {type(items).__name__}")
    # line of each item's start, for messages a user can jump to
    starts = _item_lines(text, len(items))
    for i, obj in enumerate(items):
        yield f"{path}:{starts[i]} [item {i}]", obj


def _item_lines(text: str, n: int) -> list[int]:
    """The line where each top-level item of a JSON list starts (1 when it cannot tell)."""
    dec, out, pos = json.JSONDecoder(), [], text.index("[") + 1
    ws = re.compile(r"[\s,]*")
    try:
        for _ in range(n):
            pos = ws.match(text, pos).end()
            out.append(text.count("\n", 0, pos) + 1)
            _, pos = dec.raw_decode(text, pos)
    except (ValueError, AttributeError):
        return out + [1] * (n - len(out))
    return out


def _layout(obj: Any) -> str:
    return "an AgentTraj trajectory" if is_agenttraj(obj) else "an ETO trajectory"


def read_eto_file(path: str | os.PathLike, env: str = "eto-import", split: str = "train") -> list[Episode]:
    """Episodes from ETO's trajectory format; an unusable trajectory names file, line and field."""
    out = []
    for where, obj in _json_items(Path(path)):
        try:
            out.append(from_eto(as_authors(obj), env=env, split=split))
        except (ValueError, TypeError, KeyError) as exc:
            raise RecordError(f"{where}: not {_layout(obj)}: {exc}") from None
    return out


def _in_other_splits(objs: list[dict[str, Any]], other_splits) -> dict[str, list[str]]:
    """The entries of ``objs`` (matching no training task) that are tasks of another split of the
    environment: split label -> their ids (``other_splits()``: label -> that split's tasks)."""
    if other_splits is None or not objs:
        return {}
    try:
        splits = other_splits()
    except Exception:  # noqa: BLE001 - the message must not fail because a split cannot be listed
        return {}
    found: dict[str, list[str]] = {}
    indexes = {label: task_index(t) for label, t in splits.items()}
    for obj in objs:
        for label, index in indexes.items():
            task = match_task(obj, index)
            if task is not None:
                found.setdefault(label, []).append(f"{obj.get('game_file', obj.get('id'))}"
                                                   + (f" = {task.task_id}" if str(obj.get("id")) != task.task_id else ""))
                break
    return found


def import_experts(path: str | os.PathLike, tasks: list, env_version: str,
                   other_splits=None) -> tuple[list[Episode], dict[str, Any]]:
    """Expert episodes from the authors' SFT file (or AgentGym's AgentTraj), each bound to the
    training task it belongs to.

    Every entry is checked first (a malformed one names file, line and item); entries whose id
    matches no task of ``tasks`` are reported, not imported; a second entry for a task is
    reported and skipped. Raises when no entry matches any task. ``other_splits`` (a callable:
    split label -> the environment's tasks of that split) tells tasks of another split (a test
    split) from ids of no task: the report counts them, and a file of nothing else is refused
    naming the split.
    """
    index = task_index(tasks)
    episodes, unmatched, duplicates, seen = [], [], [], set()
    unmatched_objs: list[dict[str, Any]] = []
    total = 0
    for where, obj in _json_items(Path(path)):
        total += 1
        try:
            obj = as_authors(obj)
            ep = from_eto(obj)
        except (ValueError, TypeError, KeyError) as exc:
            raise RecordError(f"{where}: not {_layout(obj)}: {exc}") from None
        task = match_task(obj, index)
        if task is None:
            unmatched.append(str(obj.get("game_file", obj.get("id"))))
            unmatched_objs.append(obj)
            continue
        if task.task_id in seen:
            duplicates.append(task.task_id)
            continue
        seen.add(task.task_id)
        episodes.append(bind_task(ep, task, env_version))
    elsewhere = _in_other_splits(unmatched_objs, other_splits)
    if not episodes and elsewhere:
        run_env = tasks[0].env if tasks else "-"
        where = "; ".join(f"{len(ids)} in split {label} (e.g. {', '.join(ids[:3])})" for label, ids in elsewhere.items())
        rest = len(unmatched) - sum(map(len, elsewhere.values()))
        raise RecordError(
            f"{path}: none of its {total} trajectories is a task of the training split of environment {run_env!r} "
            f"({len(tasks)} tasks, ids like {tasks[0].task_id if tasks else '-'}): they are tasks of its other "
            f"splits: {where}{f'; {rest} match no task' if rest else ''}. Experts are the training tasks' (BC and the "
            f"pairs train on them, and a test task must never be trained on): give the authors' file of the "
            f"training split (their {run_env}_sft.json), or experts.source=gold. Nothing was written")
    if not episodes:
        run_env = tasks[0].env if tasks else "-"
        theirs = guess_env(unmatched)
        what = (f"it is the file of another environment: its ids are those of environment {theirs!r}, and "
                f"this run's environment is {run_env!r}"
                if theirs and theirs != run_env else f"is it the file of another environment than {run_env!r}?")
        raise RecordError(f"{path}: none of its {total} trajectories matches a task of the training split "
                          f"of environment {run_env!r} ({len(tasks)} tasks, ids like "
                          f"{tasks[0].task_id if tasks else '-'}; the file's ids: {unmatched[:3]}): {what} "
                          f"(experts.source=gold, or a file of {run_env!r})")
    report = {"source": str(path), "entries": total, "imported": len(episodes),
              "unmatched": len(unmatched), "unmatched_ids": unmatched[:20],
              "unmatched_in_splits": {label: len(ids) for label, ids in elsewhere.items()},
              "duplicates": len(duplicates), "duplicate_ids": duplicates[:20],
              "tasks_without_expert": len(tasks) - len(episodes)}
    return episodes, report


def read_eto_pairs(path: str | os.PathLike) -> list[dict[str, Any]]:
    """Pairs in the authors' layout as ``{id, prompt, chosen, rejected}`` chat messages."""
    out = []
    for where, obj in _json_items(Path(path)):
        try:
            out.append(pair_from_eto(obj))
        except (ValueError, TypeError, KeyError) as exc:
            raise RecordError(f"{where}: not an ETO preference pair: {exc}") from None
    return out


# -- evaluation outputs (the explorations construct_preference.py reads) ------------------------
# The authors' eval_agent/main.py writes one file per task, outputs/<model>/<task>/<task id>.json,
# holding State.to_dict() (eval_agent/utils/datatypes.py): {"meta": {steps, reward, finished,
# success, terminate_reason, error}, "conversations": [instruction, "OK", in-context example
# turns, task, gpt, observation, ...]}. construct_preference.py keys on the file name up to its
# first "." (ALFWorld: on meta.error, the game file, its second-to-last folder), skips its
# pred_traj_offset turns (instruction, "OK" and the example) and, in ScienceWorld, cuts
# "Task Description:\n" off the task turn.
AUTHORS_OFFSET = {"webshop": 10, "sciworld": 16, "alfworld": 12}  # construct_preference.py pred_traj_offset
SCIWORLD_TASK_PREFIX = "Task Description:\n"
IDS_FILE = "ids.jsonl"  # file name -> id; not *.json, so their readers skip it


def file_safe(id: str) -> str:
    """``id`` as a file name their reader gives back whole: every character but letters, digits,
    ``_`` and ``-`` (TWX ids hold ``/``; a ``.`` would end the id for ``file.split('.')[0]``)
    becomes ``+XX`` (its hex code), so distinct ids never share a file."""
    return re.sub(r"[^A-Za-z0-9_-]", lambda m: "".join(f"+{b:02X}" for b in m.group().encode()), id)


def _file_name(id: str) -> str:
    """An evaluation output's file name (without ``.json``): the record's id as it is when it is one
    already (:func:`eto_id` made it file-safe: their reader then gives back the gold file's id), else
    :func:`file_safe` of it."""
    return id if re.fullmatch(r"[A-Za-z0-9_+-]+", id) else file_safe(id)


def prompt_example(version: str) -> list[dict[str, str]] | None:
    """The in-context example turns of the shipped prompt profile (configs/prompt/*.yaml) whose
    ``version`` is ``version``; None when no shipped profile has it. Episodes do not store the
    example (it is never trained on), their evaluation outputs do."""
    from omegaconf import OmegaConf

    for p in sorted((CONFIGS / "prompt").glob("*.yaml")):
        prof = OmegaConf.to_container(OmegaConf.load(p))
        if isinstance(prof, dict) and prof.get("version") == version:
            return list(prof.get("example") or [])
    return None


def to_eval_output(ep: Episode, id: str | None = None, example: list[dict[str, str]] | None = None) -> dict[str, Any]:
    """One episode as the authors' evaluation output: ``{"id", "env", "meta", "conversations"}``
    (``id`` and ``env`` are ours, for the export's file name and folder; their readers ignore them).

    The conversation is the opening, ``example`` (default: the example of the episode's shipped
    prompt profile), the task turn (``Task Description:`` first in ScienceWorld, as their
    environment writes it and their reader cuts it), every action and every observation, the last
    one included (their reader drops a final human turn). For their three environments the
    turns before the task must be their ``pred_traj_offset``, or their reader would cut the
    trajectory wrong: a ``ValueError`` says so.
    """
    if example is None:
        example = prompt_example(ep.prompt_version) or []
    # the opening (instruction + "OK"; a system turn becomes one), without the task turn
    opening = to_sharegpt(to_messages(ep)[:context_length(ep) - 1] or [{"role": "system", "content": ""}])
    head = opening + to_sharegpt(example)
    want = AUTHORS_OFFSET.get(ep.env)
    if want is not None and len(head) != want:
        raise ValueError(
            f"episode {ep.episode_id} ({ep.env}, prompt {ep.prompt_version!r}): {len(head)} turns before the task, "
            f"but the authors' construct_preference.py skips {want} in {ep.env} (instruction, 'OK' and their "
            f"one-shot example): export episodes played with the paper's prompt (prompt={ep.env}_eto)")
    task = ep.first_user
    if ep.env == "sciworld" and not task.startswith(SCIWORLD_TASK_PREFIX):
        task = SCIWORLD_TASK_PREFIX + task
    conv = head + [{"from": "human", "value": task}]
    for s in ep.steps:
        conv += [{"from": "gpt", "value": s.raw_output}, {"from": "human", "value": s.observation}]
    error = ep.error
    if ep.env == "alfworld":  # their ALFWorld env stores the game file in meta.error, and their reader keys on it
        error = f"{ALFWORLD_DATA_ROOT}/{ep.fold}/{ep.task_id}/game.tw-pddl"
    meta = {"steps": ep.num_steps, "reward": ep.final_score, "finished": True,
            "success": ep.success, "terminate_reason": "success" if ep.success else ep.status, "error": error}
    return {"id": id or eto_id(ep), "task_id": ep.task_id, "env": ep.env, "meta": meta, "conversations": conv}


def write_eval_outputs(out: str | os.PathLike, rows: list[dict[str, Any]]) -> dict[str, Any]:
    """``rows`` (:func:`to_eval_output`) as ``out/<env>/<id>.json``, one file per record (the id is
    :func:`eto_id`'s, file-safe, the gold file's id: their reader matches the two as they are), and
    ``out/ids.jsonl`` (file -> id and task id); the folder is written aside and swapped in whole.
    ``out`` is what their construct_preference.py calls ``outputs/<model>``."""
    import shutil

    from .store import write_atomic

    out = Path(out)
    if out.suffix in (".json", ".jsonl"):
        raise ValueError(f"export.output: {out}: the authors' evaluation layout is a folder (one file per task), "
                         f"e.g. {out.with_suffix('')}/outputs/<model name>")
    files: dict[str, str] = {}
    task_ids: dict[str, str] = {}
    for r in rows:
        name = f"{r.get('env', 'episodes')}/{_file_name(str(r['id']))}.json"
        if name in files:
            raise ValueError(f"export: two records would both be {name} (ids {files[name]!r} and {r['id']!r})")
        files[name] = str(r["id"])
        task_ids[name] = str(r.get("task_id", r["id"]))
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    for r, name in zip(rows, files):
        (tmp / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp / name).write_text(json.dumps(r, ensure_ascii=False, indent=4) + "\n", encoding="utf-8")
    tmp.mkdir(parents=True, exist_ok=True)
    write_atomic(tmp / IDS_FILE, "".join(json.dumps({"file": n, "id": i, "task_id": task_ids[n]}) + "\n"
                                         for n, i in files.items()))
    old = out.with_name(f".{out.name}.old-{os.getpid()}")
    if out.exists():
        out.rename(old)
    tmp.rename(out)
    shutil.rmtree(old, ignore_errors=True)
    return {"files": len(files), "ids_file": str(out / IDS_FILE)}
