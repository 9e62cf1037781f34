"""WebShop adapter (Princeton's ``WebAgentTextEnv``, text observations) with the ETO paper's splits.

The simulator. ``env.text_env`` names the text environment class as ``module:Class``, imported
on first use: ``web_agent_site.envs:WebAgentTextEnv`` (github princeton-nlp/WebShop, run from
its repository) or ``webshop.web_agent_site.envs:WebAgentTextEnv`` (the ETO fork, ``pip install
-e envs/webshop`` in Yifan-Song793/ETO). Either needs its product data and search index (the
WebShop repository's setup script). It is built as ETO builds it: ``observation_mode="text"``,
``human_goals=True`` (plus ``env.env_kwargs``), and a goal is played with ``reset(session=<goal
index>)``, the index into the simulator's goal list that ETO's split files hold.

Splits are the paper's files in ``data/webshop_eto``: train (``train_indices.json``, 1824 entries
for 1823 goals: goal 4116 is listed twice and played once here) and ``seen`` (ETO's test list,
200 goals; WebShop has one test set). Note that 21 goals of ETO's test list are also in its
train list; the files are kept as the authors released them. ``dev`` (model selection) is no
test list: ``env.dev_holdout`` holds training goals out (envs/holdout.py, as for the other
environments), or a split given as ``{not_in: [files], count: N, start: 0}`` takes the first N
goal indices from ``start`` on that none of those files names (goals no ETO list uses). A task
is ``WebShopTask(game="webshop", seed=<goal index>)``; its id is the goal index as a string, the
id of ETO's outputs and of its released data.

Episodes play as ETO's ``WebShopEnv`` plays them: the instruction and the observations are the
simulator's text, passed through (the first observation is the search page, which states the
instruction); ``click[buy now]`` ends the episode with WebShop's reward in [0, 1], and only a
perfect purchase (reward 1.0) is a success; the paper's step limit is 10. An action is valid when
the page offers it (``get_available_actions``: ``search[...]`` where there is a search bar,
``click[x]`` for a listed clickable). Like ETO, the adapter hands every action to the simulator,
which itself ignores clicks it does not offer (but searches from any page); an
``AssertionError`` of the simulator reads "Invalid action!" as in ETO.

One product catalogue per process. The simulator's ``SimServer`` holds every product, the goals
and the search engine (gigabytes for the full catalogue); the adapters of a rollout pool share
the first one's server (``WebAgentTextEnv(server=...)``) and each plays in its own sessions.

Experts. WebShop ships no gold action sequence: the paper's experts are human/GPT-4
demonstrations, imported from the authors' released SFT file (``experts.source``). A text
environment with a ``gold_actions(session)`` method (the tests' fake shop) gives its own.
"""

from __future__ import annotations

import importlib
import itertools
import json
import re
from dataclasses import dataclass
from importlib.metadata import packages_distributions
from importlib.metadata import version as pkg_version
from pathlib import Path
from typing import Annotated, Any, Optional, Union

from pydantic import Discriminator, Field, Tag

from ..config import Choice, EnvSection, Flag, Int, Rule, Section, Text, Texts
from ..layout import from_repo
from .base import EnvironmentFailure, StepResult, Task

GAME = "webshop"  # one task family
OBSERVATION_MODES = ("html", "text", "text_rich", "url")  # WebAgentTextEnv's observation modes
ACTION_FORMS = ["search[<keywords>]", "click[<button, product or option>]"]
INVALID = "Invalid action!"  # ETO's answer when the simulator asserts on an action
# WebShop's own action parser (web_agent_site/engine/engine.py: parse_action)
_ACTION = re.compile(r"(.+)\[(.+)\]")
INSTALL = ("WebShop is not installed. Install it with its product data and search index: "
           "github.com/princeton-nlp/WebShop (run its setup.sh; text_env "
           "web_agent_site.envs:WebAgentTextEnv with the repository on PYTHONPATH) or the ETO fork "
           "(github.com/Yifan-Song793/ETO: pip install -e envs/webshop, then its data; text_env "
           "webshop.web_agent_site.envs:WebAgentTextEnv), and set env.text_env to the class")
NO_GOLD = ("WebShop has no gold action sequence in its package (the paper's experts are human and "
           "GPT-4 demonstrations), so experts.source=gold cannot play one: set experts.source to the "
           "authors' released SFT file (webshop_sft.json: setup.sh of github.com/Yifan-Song793/ETO, or "
           "huggingface.co/datasets/agent-eto/eto-sft-trajectory) to import them, or use a text "
           "environment with a gold_actions(session) method (env.text_env={})")


@dataclass(frozen=True)
class WebShopTask(Task):
    """A WebShop goal; ``task_id`` is its index, as ETO names its outputs."""

    @property
    def task_id(self) -> str:
        return str(self.seed)


def load_text_env(spec: str) -> type:
    """The class ``module:Class`` names (imported now), with an install hint when it is missing."""
    module, _, name = str(spec).partition(":")
    if not module or not name:
        raise ValueError(f"env.text_env: {spec!r} is not 'module:Class', e.g. web_agent_site.envs:WebAgentTextEnv")
    try:
        mod = importlib.import_module(module)
    except ImportError as exc:
        raise ImportError(f"env.text_env={spec}: cannot import {module} ({exc}). {INSTALL}") from exc
    cls = getattr(mod, name, None)
    if not isinstance(cls, type):
        raise ImportError(f"env.text_env={spec}: module {module} has no class {name}")
    return cls


def _module_version(module: str) -> str:
    top = module.split(".")[0]
    for dist in packages_distributions().get(top, []):
        try:
            return pkg_version(dist)
        except Exception:
            continue
    try:
        return str(getattr(importlib.import_module(module), "__version__", "unversioned"))
    except ImportError:
        return "not installed"  # the task lists (BC on imported experts) need no install


# (text_env, its keywords) -> the server (catalogue, goals, search engine) the adapters share
_SERVERS: dict[tuple[str, str], Any] = {}
_ADAPTERS = itertools.count()


class WebShopEnv:
    """One WebShop browser; implements :class:`eto_train.envs.base.Environment`."""

    name = "webshop"

    class Config(EnvSection):
        """The ``env`` section of configs/env/webshop.yaml."""

        class Split(Section):
            """Goals no ETO list names: ``count`` of them from ``start``, none of the files ``not_in``."""

            not_in: Texts(nonempty=False) = []
            count: Int(ge=1)
            start: Int(ge=0) = 0

        step_limit: Int(ge=1, when=" (max steps per episode)")
        splits: Annotated[dict[str, Annotated[
            Union[Annotated[Annotated[str, Field(min_length=1)], Tag("file")], Annotated[Split, Tag("goals")]],
            Discriminator(lambda v: "file" if isinstance(v, str) else "goals"),
            Rule("a file of goal indices in env.data_dir, or {not_in: [files], count: <int >= 1>, "
                 "start: <int >= 0>}")]], Field(min_length=1), Rule("a mapping of split name -> split")]
        text_env: Text(what="'module:Class', e.g. web_agent_site.envs:WebAgentTextEnv",
                       pattern=r"^[\w.]+:[\w.]+$")
        observation_mode: Choice(OBSERVATION_MODES)
        human_goals: Flag
        env_kwargs: Annotated[Optional[dict[str, Any]], Rule("a mapping of WebAgentTextEnv keywords, or null (none)")]
        share_server: Flag
        data_dir: Text()
        limit: Int(ge=1, null="every goal")

    def __init__(self, splits: dict[str, Any], text_env: str = "web_agent_site.envs:WebAgentTextEnv",
                 data_dir: str = "data/webshop_eto", step_limit: int = 10, observation_mode: str = "text",
                 human_goals: bool = True, env_kwargs: dict[str, Any] | None = None,
                 limit: int | None = None, share_server: bool = True, **_: Any) -> None:
        self.data_dir = self._find(data_dir)
        self.splits = dict(splits)
        for split, spec in self.splits.items():
            for f in self._files(split, spec):
                if not (self.data_dir / f).is_file():
                    raise ValueError(f"env.splits.{split}: no file {f} in {self.data_dir}")
        self.step_limit = int(step_limit)
        self.limit = None if limit is None else int(limit)
        self.text_env = str(text_env)
        self.kwargs = {"observation_mode": str(observation_mode), "human_goals": bool(human_goals),
                       **dict(env_kwargs or {})}
        self.share_server = bool(share_server)
        if ":" not in self.text_env:
            raise ValueError(f"env.text_env: {self.text_env!r} is not 'module:Class', e.g. web_agent_site.envs:WebAgentTextEnv")
        # imported on first use: the task lists (and an import of the authors' expert file for BC)
        # need no WebShop install; playing does, and check_playable() says so before long work
        self._text_env_cls: type | None = None
        self._env = None  # the text environment, built on first use (loading the catalogue is slow)
        self._prefix = f"eto{next(_ADAPTERS)}-"  # this adapter's sessions on a shared server
        self._reward = 0.0
        self._version: str | None = None

    # -- configuration ----------------------------------------------------------------------
    @staticmethod
    def _find(data_dir: str) -> Path:
        p = from_repo(data_dir, Path.is_dir)
        if not p.is_dir():
            raise ValueError(f"env.data_dir: {data_dir} is not a folder (the ETO split files, data/webshop_eto)")
        return p

    @staticmethod
    def _files(split: str, spec: Any) -> list[str]:
        if isinstance(spec, str):
            return [spec]
        if isinstance(spec, dict) and set(spec) <= {"not_in", "count", "start"} and "count" in spec \
                and isinstance(spec.get("not_in", []), list):
            return [str(f) for f in spec.get("not_in", [])]
        raise ValueError(f"env.splits.{split}: {spec!r} is neither a file of goal indices nor "
                         "{not_in: [files], count: N, start: 0}")

    def _read(self, name: str) -> list[int]:
        data = json.loads((self.data_dir / name).read_text())
        if not isinstance(data, list) or not all(isinstance(i, int) and i >= 0 for i in data):
            raise ValueError(f"{self.data_dir / name}: expected a JSON list of goal indices")
        return data

    def _indices(self, split: str) -> list[int]:
        spec = self.splits[split]
        if isinstance(spec, str):
            return list(dict.fromkeys(self._read(spec)))  # in order; a repeated goal is played once
        listed = {i for f in self._files(split, spec) for i in self._read(f)}
        count, out = int(spec["count"]), []
        i = int(spec.get("start", 0))
        while len(out) < count:
            if i not in listed:
                out.append(i)
            i += 1
        return out

    @property
    def version(self) -> str:
        if self._version is None:  # read per episode: the distribution lookup is done once
            module = self.text_env.partition(":")[0]
            kw = json.dumps(self.kwargs, sort_keys=True, default=str)
            self._version = f"webshop=={_module_version(module)};text_env={self.text_env};{kw};step_limit={self.step_limit}"
        return self._version

    def tasks(self, split: str) -> list[Task]:
        if split not in self.splits:
            raise KeyError(f"env.splits has no split {split!r} (has {sorted(self.splits)})")
        spec = self.splits[split]
        fold = Path(spec).stem.removesuffix("_indices") if isinstance(spec, str) else "unlisted"
        idxs = self._indices(split)
        if self.limit is not None:
            idxs = idxs[:self.limit]
        return [WebShopTask("webshop", GAME, fold, i, split) for i in idxs]

    def max_steps(self, task: Task) -> int:
        return self.step_limit

    def action_forms(self, game: str) -> list[str]:
        return ACTION_FORMS

    # -- the simulator ----------------------------------------------------------------------
    @property
    def _cls(self) -> type:
        if self._text_env_cls is None:
            self._text_env_cls = load_text_env(self.text_env)
        return self._text_env_cls

    def check_playable(self) -> None:
        """Raise now (with what to install) when the text environment cannot be imported."""
        self._cls

    def _require(self):
        if self._env is None:
            key = (self.text_env, json.dumps(self.kwargs, sort_keys=True, default=str))
            kwargs = {"session_prefix": self._prefix, **self.kwargs}
            if self.share_server and key in _SERVERS:
                kwargs["server"] = _SERVERS[key]
            cls = self._cls  # not installed: ImportError, never an environment failure to retry
            try:
                self._env = cls(**kwargs)
            except FileNotFoundError as exc:
                raise FileNotFoundError(f"env.text_env={self.text_env}: WebShop's product data or search "
                                        f"index is missing ({exc}). {INSTALL}") from exc
            except Exception as exc:
                raise EnvironmentFailure(f"WebShop {self.text_env} did not start: {exc}") from exc
            server = getattr(self._env, "server", None)
            if self.share_server and server is not None:
                _SERVERS.setdefault(key, server)
        return self._env

    def _forget_session(self) -> None:
        """Drop this adapter's last session from the (shared) server: sessions are never reused."""
        env = self._env
        sessions = getattr(getattr(env, "server", None), "user_sessions", None)
        if isinstance(sessions, dict) and getattr(env, "session", None) is not None:
            sessions.pop(env.session, None)

    def _instruction(self, env, observation: str) -> str:
        text = str(getattr(env, "instruction_text", "") or "").strip()
        if not text:  # the search page reads "WebShop [SEP] Instruction: [SEP] <goal> [SEP] Search"
            parts = [p.strip() for p in observation.split("[SEP]")]
            text = next((parts[i + 1] for i, p in enumerate(parts[:-1]) if p == "Instruction:"), "")
        return text[len("instruction:"):].strip() if text.lower().startswith("instruction:") else text

    def available(self, action: str) -> bool:
        """Whether the current page offers ``action`` (the simulator's own test, case-folded)."""
        m = _ACTION.match(action.strip())
        if m is None:
            return False
        verb, arg = m.group(1), m.group(2).lower()
        try:
            offer = self._require().get_available_actions()
        except Exception as exc:
            raise EnvironmentFailure(f"WebShop get_available_actions failed: {exc}") from exc
        if verb == "search":
            return bool(offer.get("has_search_bar")) and bool(arg.strip())
        return verb == "click" and arg != "search" and arg in offer.get("clickables", [])

    # -- episode ----------------------------------------------------------------------------
    def reset(self, task: Task) -> tuple[str, StepResult]:
        env = self._require()
        self._forget_session()
        try:
            obs, _ = env.reset(session=int(task.seed))
        except IndexError as exc:  # the split names a goal the simulator does not have
            raise ValueError(f"WebShop goal {task.seed} ({task.split}): no such goal in {self.text_env} "
                             f"({exc}); check env.splits and env.env_kwargs") from exc
        except Exception as exc:
            raise EnvironmentFailure(f"WebShop reset(session={task.seed}) failed: {exc}") from exc
        obs = str(obs)
        self._reward = 0.0
        return self._instruction(env, obs), StepResult(observation=obs, reward=0.0, done=False, success=False,
                                                       info={"recognized": True})

    def step(self, action: str) -> StepResult:
        env = self._require()
        valid = self.available(action)
        try:
            obs, reward, done, _info = env.step(action)
        except AssertionError:  # as ETO's WebShopEnv: the episode goes on
            return StepResult(observation=INVALID, reward=self._reward, done=False, success=False,
                              info={"recognized": False})
        except Exception as exc:
            raise EnvironmentFailure(f"WebShop step({action!r:.120}) failed: {exc}") from exc
        done = bool(done)
        if done:  # only the purchase is scored
            self._reward = max(self._reward, min(1.0, max(0.0, float(reward or 0.0))))
        success = done and self._reward >= 1.0 - 1e-9
        return StepResult(observation=str(obs), reward=self._reward, done=done, success=success,
                          failure=done and not success,
                          info={"recognized": valid, "webshop_reward": float(reward or 0.0)})

    def expert_actions(self, task: Task) -> list[str]:
        from ..prompting import parse_action  # the form the policy's actions take (lower case)

        if not callable(getattr(self._cls, "gold_actions", None)):
            raise NotImplementedError(NO_GOLD.format(self.text_env))
        actions = []
        for a in self._require().gold_actions(int(task.seed)):
            norm = parse_action(f"Action: {a}")
            if norm is None:
                raise ValueError(f"WebShop goal {task.seed}: empty gold action in {self.text_env}.gold_actions")
            actions.append(norm)
        return actions

    def close(self) -> None:
        if self._env is not None:
            self._forget_session()
            try:
                self._env.close()
            except Exception:
                pass
        self._env = None
