"""Environments that misbehave (issue 37, items 1-5): one guard around every adapter (envs/guard.py).

Each row of the issue's first table, played with the docs' Lamps adapter misbehaving on purpose
(tests/misbehaving_env.py, ``env.misbehave``), ends in a one-block error or a named, bounded outcome:
a reward of 7.0, a hung step, an adapter that raises, gold paths that lose, a 1 MB observation, a new
version of the plug-in, an entry point whose module does not import, ``env=agentgym_webshop`` with the
default ``eval.splits``; and docs/environments.md's one-liner runs as written (test_env_plugins.py).
Policies are scripted (``rollouts.play.make_policy`` patched): every test runs in seconds.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

import misbehaving_env
from eto_train import cli
from eto_train.envs import AdapterContractError, make_env
from eto_train.records import PolicyRef
from eto_train.rollouts.loop import run_rollouts
from test_pipeline import ROOT, TOY
from fixture_settings import env_common, react_prompt, rollout_config

TOY_NO_ENV = [o for o in TOY if not o.startswith("env.")]
ADAPTER = "misbehaving_env:BadLamps"
SECTION = {**misbehaving_env.Config(adapter=ADAPTER, **env_common()).model_dump(mode="json")}


class Scripted:
    """Answers every conversation with one action."""

    def __init__(self, action: str) -> None:
        self.text = f"Action: {action}"

    def generate(self, convs):
        return [(self.text, 10, 3, 0) for _ in convs]


@pytest.fixture(autouse=True)
def _release_hung_calls():
    misbehaving_env.RELEASE.clear()
    yield
    misbehaving_env.RELEASE.set()  # a hung step's thread returns
    misbehaving_env.VERSION = "1"


@pytest.fixture(autouse=True)
def _badlamps_config():
    """``env=badlamps``: the misbehaving adapter's section, as a plug-in's Config gives it."""
    from hydra.core.config_store import ConfigStore

    ConfigStore.instance().store(group="env", name="badlamps", node=SECTION)


def compose(tmp_path: Path, *overrides: str):
    from hydra import compose as hydra_compose, initialize_config_dir

    from eto_train.config import load

    with initialize_config_dir(str(ROOT / "configs"), version_base="1.3", job_name="test"):
        cfg = hydra_compose("config", overrides=[f"paths.runs={tmp_path / 'runs'}", "run_name=r", "env=badlamps",
                                                 *TOY_NO_ENV, *overrides])
    return load(cfg)


def play(cfg: dict, action: str, split: str = "seen", retries: int = 0) -> list:
    lister = make_env(cfg)
    try:
        tasks = lister.tasks(split)[:2]
    finally:
        lister.close()
    episodes: list = []
    run_rollouts([(t, 0) for t in tasks], lambda: make_env(cfg), Scripted(action), PolicyRef(id="scripted@0"),
                 react_prompt(), rollout_config(batch_size=2, env_retries=retries), on_episode=episodes.append)
    return episodes


def cli_run(monkeypatch, capsys, stage: str, tmp_path: Path, *overrides: str) -> tuple[int, str]:
    monkeypatch.setattr(sys, "argv", ["eto-train"])
    code = 0
    try:
        cli.main([stage, f"paths.runs={tmp_path / 'runs'}", "run_name=r", *TOY_NO_ENV, *overrides])
    except SystemExit as exc:
        code = exc.code
    return code, capsys.readouterr().err


def scripted(monkeypatch, action: str) -> None:
    monkeypatch.setattr("eto_train.rollouts.play.make_policy", lambda *a, **k: Scripted(action))


# -- 1. answers checked as they arrive ---------------------------------------------------------------
@pytest.mark.parametrize("workers", [0, 1])
def test_a_reward_of_7_stops_with_one_line_naming_adapter_task_step_and_value(workers):
    cfg = {**SECTION, "misbehave": "reward7", "workers": workers}
    with pytest.raises(AdapterContractError) as err:
        play(cfg, "turn on lamp 9")
    msg = str(err.value)
    assert msg.startswith("misbehaving_env:BadLamps (env=lamps) step('turn on lamp 9') on task lamps/seen/200, "
                          "step 1: reward 7.0 is outside [0, 1]") and "\n" not in msg
    assert ("[in env worker 0 (pid " in msg) == bool(workers)


@pytest.mark.parametrize("misbehave, found", [
    ("nan", "reward nan is not a finite number"),
    ("success_not_done", "success=True on a step that is not done (done=False)"),
    ("big", "step('look') on task lamps/train/0, step 1: observation of 1,000,000 characters, over "
            "env.max_observation_chars=65,536"),
])
def test_each_breach_of_the_contract_is_named(misbehave, found):
    env = make_env({**SECTION, "misbehave": misbehave})
    try:
        task = env.tasks("train")[0]
        env.reset(task)
        with pytest.raises(AdapterContractError, match=__import__("re").escape(found)):
            for action in env.expert_actions(task):
                env.step(action)
    finally:
        env.close()


def test_an_adapter_declares_its_own_reward_range():
    env = make_env({**SECTION, "adapter": "misbehaving_env:WideLamps", "misbehave": "reward7"})
    env.reset(env.tasks("seen")[0])
    assert env.step("turn on lamp 9").reward == 7.0  # within its (0, 10)
    env.close()
    with pytest.raises(AdapterContractError, match=r"misbehaving_env:BadRangeLamps.reward_range=\(1.0, 0.0\): two "
                                                   r"finite numbers \(low, high\) with low < high"):
        make_env({**SECTION, "adapter": "misbehaving_env:BadRangeLamps"})


def test_the_reward_7_adapter_puts_no_pair_in_any_pairs_file(tmp_path, tiny_model_dir, monkeypatch):
    from eto_train.stages import experts
    from eto_train.stages.eto import run_iteration

    cfg = compose(tmp_path, "env.misbehave=reward7")
    experts.run(cfg)  # the gold paths win (reward 1.0): nothing wrong there
    scripted(monkeypatch, "turn on lamp 9")  # the explorer loses every game: the adapter scores it 7.0
    with pytest.raises(AdapterContractError, match=r"step\('turn on lamp 9'\) on task lamps/train/\d, step 1: "
                                                   r"reward 7.0 is outside \[0, 1\]"):
        run_iteration(cfg, 1, str(tiny_model_dir))
    run = tmp_path / "runs" / "r"
    assert not list(run.rglob("pairs.jsonl")) and not list(run.rglob("dpo"))
    manifest = json.loads((run / "eto" / "iter1" / "explore" / "manifest.json").read_text())
    assert manifest["status"] == "running"  # not done: nothing is reused from it


# -- 2. every call bounded and named -----------------------------------------------------------------
@pytest.mark.parametrize("workers", [0, 1])
def test_a_hung_step_is_a_named_timeout_in_the_rollouts_process_and_in_a_worker(workers):
    episodes = play({**SECTION, "misbehave": "hang", "call_timeout_s": 0.5, "workers": workers}, "look")
    assert [e.status for e in episodes] == ["environment_failure"] * 2
    first = next(e for e in episodes if e.task_id == "lamps/seen/200")
    assert first.env_errors[0].startswith(
        "EnvironmentTimeout: misbehaving_env:BadLamps (env=lamps) step('look') on task lamps/seen/200, step 1: no "
        "answer within env.call_timeout_s=0.5 s")


def test_the_environments_own_time_per_step_is_recorded():
    episodes = play({**SECTION, "misbehave": "slow"}, "look")
    steps = [s for e in episodes for s in e.steps]
    assert steps and all(s.env_s >= 0.29 for s in steps)  # the adapter sleeps 0.3 s per step
    assert "env_s" in episodes[0].to_dict()["steps"][0]


@pytest.mark.parametrize("misbehave, call", [("raise", "step('look') on task lamps/seen/200, step 1 raised "
                                                      "ValueError: lamp controller crashed"),
                                             ("raise_reset", "reset on task lamps/seen/200 raised ValueError: lamp "
                                                             "controller not found")])
def test_an_exception_from_the_adapter_is_one_block_exit_2(misbehave, call, tmp_path, tiny_model_dir, monkeypatch,
                                                           capsys):
    scripted(monkeypatch, "look")
    code, err = cli_run(monkeypatch, capsys, "eval", tmp_path, "env=badlamps", f"env.misbehave={misbehave}",
                        f"eval.policy={tiny_model_dir}", "eval.splits=[seen]")
    assert code == 2 and "Traceback" not in err
    assert err.startswith(f"eto-train eval: AdapterError: misbehaving_env:BadLamps (env=lamps) {call}")
    assert len(err.strip().splitlines()) == 1


def test_an_eval_where_every_episode_is_an_environment_failure_exits_non_zero_saying_so(
        tmp_path, tiny_model_dir, monkeypatch, capsys):
    scripted(monkeypatch, "look")
    code, err = cli_run(monkeypatch, capsys, "eval", tmp_path, "env=badlamps", "env.misbehave=envfail",
                        f"eval.policy={tiny_model_dir}", "eval.splits=[seen]", "rollout.env_retries=0")
    assert code == 2 and "Traceback" not in err
    folder = tmp_path / "runs" / "r" / "eval" / "bc" / "seen"
    assert err.startswith("eto-train eval: NothingScored: [eval/bc/seen] every one of its 3 episodes ended as "
                          "environment_failure")
    assert "lamp controller unreachable" in err and f"kept in {folder / 'episodes.jsonl'}" in err
    assert len((folder / "episodes.jsonl").read_text().splitlines()) == 3  # the record is kept


# -- issue 53, item 1: a play of environment failures is never done, never cached ----------------------
def _fixed(monkeypatch) -> None:
    """The environment fixed, with the very same config (env.misbehave=envfail stays in the stage hash)."""
    from eto_lamps import LampsEnv

    monkeypatch.setattr(misbehaving_env.BadLamps, "step", LampsEnv.step)


def test_an_eval_refused_for_environment_failures_plays_them_again_once_the_environment_is_fixed(
        tmp_path, tiny_model_dir, monkeypatch, capsys):
    scripted(monkeypatch, "look")
    args = ("env=badlamps", "env.misbehave=envfail", f"eval.policy={tiny_model_dir}", "eval.splits=[seen]",
            "rollout.env_retries=0")
    code, err = cli_run(monkeypatch, capsys, "eval", tmp_path, *args)
    folder = tmp_path / "runs" / "r" / "eval" / "bc" / "seen"
    assert code == 2 and "environment_failure: 3" in err and "the stage is not done" in err
    assert json.loads((folder / "manifest.json").read_text())["status"] == "running"  # never "done"
    _fixed(monkeypatch)
    code, err = cli_run(monkeypatch, capsys, "eval", tmp_path, *args)  # the same command, no hand edit
    assert code == 0, err
    rows = [json.loads(line) for line in (folder / "episodes.jsonl").read_text().splitlines()]
    assert len(rows) == 3 and not any(r["status"] == "environment_failure" for r in rows)
    assert json.loads((folder / "manifest.json").read_text())["status"] == "done"
    assert json.loads((folder / "metrics.json").read_text())["overall"]["environment_failures"] == 0
    assert sorted(p.name for p in folder.iterdir()) == [".identity.json", "episodes.jsonl", "manifest.json",
                                                         "metrics.json"] or \
        sorted(p.name for p in folder.iterdir()) == ["episodes.jsonl", "manifest.json", "metrics.json"]


def _explore(tmp_path, policy, *overrides):
    from eto_train.stages.eto import explore

    cfg = compose(tmp_path, "env.misbehave=envfail", "rollout.env_retries=0", "eto.explore.tasks_per_game=2",
                  *overrides)
    out = tmp_path / "runs" / "r" / "eto" / "iter1"
    return explore.run(cfg, 1, str(policy), {}, out)[0], out / "explore", tmp_path / "runs" / "r" / "cache" / "explore"


def _cached(cache: Path) -> list[Path]:
    return [m.parent for m in cache.glob("*/manifest.json")] if cache.exists() else []


def test_an_exploration_of_environment_failures_is_not_done_nor_cached_and_explores_again_once_fixed(
        tmp_path, tiny_model_dir, monkeypatch, capsys):
    from eto_train.rollouts.play import NothingScored

    scripted(monkeypatch, "look")
    with pytest.raises(NothingScored) as exc:
        _explore(tmp_path, tiny_model_dir)
    msg = str(exc.value)
    assert msg.startswith("[explore/iter1] every one of its 2 episodes ended as environment_failure")
    assert "2 of its 2 episodes ended as environment failures (all; environment_failure: 2)" in msg
    assert "e.g. " in msg and "lamp controller unreachable" in msg
    folder = tmp_path / "runs" / "r" / "eto" / "iter1" / "explore"
    assert f"kept in {folder / 'episodes.jsonl'}" in msg
    assert _cached(tmp_path / "runs" / "r" / "cache" / "explore") == []  # nothing published
    _fixed(monkeypatch)
    episodes, folder, cache = _explore(tmp_path, tiny_model_dir)  # the same command explores again
    assert "playing those again" in capsys.readouterr().out
    assert len(episodes) == 2 and not any(e.status == "environment_failure" for e in episodes)
    assert json.loads((folder / "manifest.json").read_text())["status"] == "done" and len(_cached(cache)) == 1


@pytest.mark.parametrize("share, refused", [(0.5, False), (0.25, True)])
def test_more_environment_failures_than_the_share_is_refused(tmp_path, tiny_model_dir, monkeypatch, share, refused):
    from eto_lamps import LampsEnv

    from eto_train.envs import EnvironmentFailure
    from eto_train.rollouts.play import EnvironmentFailures

    def step(self, action):  # one task of two: the environment fails there
        if self.target == 1:
            raise EnvironmentFailure("lamp 1 controller unreachable")
        return LampsEnv.step(self, action)

    scripted(monkeypatch, "look")
    monkeypatch.setattr(misbehaving_env.BadLamps, "step", step)
    over = f"rollout.max_env_failure_share={share}"
    if not refused:
        episodes, _, cache = _explore(tmp_path, tiny_model_dir, over)
        assert sum(e.status == "environment_failure" for e in episodes) == 1 and len(_cached(cache)) == 1
        return
    with pytest.raises(EnvironmentFailures, match=r"1 of its 2 episodes ended as environment failures \(more than "
                                                   r"rollout.max_env_failure_share=0.25 of them; environment_failure: "
                                                   r"1\); e.g. .*lamp 1 controller unreachable"):
        _explore(tmp_path, tiny_model_dir, over)


def test_an_exploration_an_older_version_finished_on_environment_failures_is_redone(
        tmp_path, tiny_model_dir, monkeypatch, capsys):
    """What an older version left: a "done" exploration of environment failures, in the run and in the
    cache. Neither is reused: the stage explores again, saying why."""
    from eto_train.rollouts import play

    scripted(monkeypatch, "look")
    real = play.refuse_failures
    monkeypatch.setattr(play, "refuse_failures", lambda *a, **k: None)  # the older version: no such check
    episodes, folder, cache = _explore(tmp_path, tiny_model_dir)
    assert all(e.status == "environment_failure" for e in episodes) and len(_cached(cache)) == 1
    monkeypatch.setattr(play, "refuse_failures", real)
    _fixed(monkeypatch)
    capsys.readouterr()
    episodes, folder, cache = _explore(tmp_path, tiny_model_dir)
    out = capsys.readouterr().out
    assert f"[explore/iter1] finished in {folder}, but 2 of its 2 episodes ended as environment failures (all" in out
    assert "doing it again" in out and "up to date" not in out
    assert "not reused" in out and "reusing" not in out  # the cache's copy neither
    assert len(episodes) == 2 and not any(e.status == "environment_failure" for e in episodes)
    assert len(_cached(cache)) == 1 and '"environment_failures": 0' in (_cached(cache)[0] / "manifest.json").read_text()


# -- 3. experts that lose are named at the experts stage ----------------------------------------------
def test_gold_paths_that_lose_are_named_and_on_lost_error_makes_it_an_error(tmp_path, capsys):
    from eto_train.stages import bc, experts

    cfg = compose(tmp_path, "env.misbehave=lose")
    file = tmp_path / "runs" / "r" / "experts" / "train.jsonl"
    with pytest.raises(experts.LostExperts, match=r"^6 of 6 gold paths did not win in the environment: lamps/train/0 "
                                                  r"\(failure, score 0\), lamps/train/1 .* and 1 more.*"
                                                  r"experts.on_lost=error, so .*train.jsonl was not written"):
        experts.run(cfg.with_values({"experts.on_lost": "error"}))
    assert not file.exists()
    capsys.readouterr()
    experts.run(cfg)
    out = capsys.readouterr().out
    assert "[experts] warning: 6 of 6 gold paths did not win in the environment: lamps/train/0 (failure" in out
    assert "(none did: bc will have nothing to clone)" in out and str(file) in out
    with pytest.raises(ValueError, match=rf"{file}: no usable trajectories for behavior cloning: none of its 6 "
                                         r"episodes is a gold path that won .* e.g. lamps/train/0"):
        bc.run(cfg)


# -- 1 again: a 1 MB observation --------------------------------------------------------------------
def test_a_1mb_observation_stops_the_experts_stage_naming_the_limit(tmp_path):
    from eto_train.stages import experts

    cfg = compose(tmp_path, "env.misbehave=big")
    with pytest.raises(AdapterContractError, match=r"step\('look'\) on task lamps/train/0, step 1: observation of "
                                                   r"1,000,000 characters, over env.max_observation_chars=65,536"):
        experts.run(cfg)
    assert not (tmp_path / "runs" / "r" / "experts" / "train.jsonl").exists()
    experts.run(cfg.with_values({"env.max_observation_chars": 2_000_000}))  # named and configurable
    assert (tmp_path / "runs" / "r" / "experts" / "train.jsonl").exists()


# -- 4. a changed plug-in is played again, never reused ------------------------------------------------
def _play_eval(cfg, tiny_model_dir, share):
    from eto_train.model.load import policy_ref
    from eto_train.rollouts.play import Rollouts

    rollouts = Rollouts(cfg, str(tiny_model_dir), policy_ref(str(tiny_model_dir), name="bc"), cfg.rollout)
    out = Path(cfg.paths.run) / "eval" / "bc" / "seen"
    return rollouts.play("eval/bc/seen", out, [(t, 0) for t in rollouts.tasks("seen")], share=share)


def test_a_new_version_of_the_plugin_is_played_again_and_says_why(tmp_path, tiny_model_dir, monkeypatch, capsys):
    from eto_train.stages import experts

    scripted(monkeypatch, "look")
    cfg = compose(tmp_path)
    share = tmp_path / "cache"
    experts.run(cfg)
    assert {e.env_version for e in _play_eval(cfg, tiny_model_dir, share)} == {"badlamps-1"}
    capsys.readouterr()
    experts.run(cfg.with_values({"env.call_timeout_s": 5}))  # the guard's bounds change no episode
    _play_eval(cfg, tiny_model_dir, share)
    assert capsys.readouterr().out.count("up to date") == 2

    misbehaving_env.VERSION = "2"  # the same config, a new release of the adapter
    experts.run(cfg)
    assert {e.env_version for e in _play_eval(cfg, tiny_model_dir, share)} == {"badlamps-2"}  # not the cache's
    out = capsys.readouterr().out.replace("\n", "")
    assert "[experts] finished in" in out and ("with another environment: it played misbehaving_env:BadLamps version "
                                               "'badlamps-1', this run has misbehaving_env:BadLamps version "
                                               "'badlamps-2': doing it again") in out
    assert "[eval/bc/seen] finished in" in out and "up to date" not in out
    file = tmp_path / "runs" / "r" / "experts" / "train.jsonl"
    assert {json.loads(line)["env_version"] for line in file.read_text().splitlines()} == {"badlamps-2"}


def test_a_stage_finished_before_the_identity_was_hashed_is_kept_when_its_episodes_version_matches(
        tmp_path, capsys):
    """A manifest written before issue 37 (no ``environment`` in its config, the hash without it) stays
    done when its episodes record this adapter's version, so finished runs of the built-in environments
    are not played again; another version is played again, saying which one its episodes record."""
    from eto_train.runtime import config_hash
    from eto_train.stages import experts

    cfg = compose(tmp_path)
    experts.run(cfg)
    path = tmp_path / "runs" / "r" / "experts" / "manifest.json"
    m = json.loads(path.read_text())
    old = {k: v for k, v in m["config"].items() if k != "environment"}
    path.write_text(json.dumps({**m, "config": old, "config_hash": config_hash(old)}))
    capsys.readouterr()
    experts.run(cfg)
    assert "up to date" in capsys.readouterr().out
    misbehaving_env.VERSION = "2"
    experts.run(cfg)
    out = capsys.readouterr().out.replace("\n", "")
    assert ("with another environment: its episodes record version 'badlamps-1' (it finished before the adapter's "
            "identity was part of the stage hash), this run has misbehaving_env:BadLamps version 'badlamps-2'") in out


# -- 5. up-front checks ------------------------------------------------------------------------------
def test_a_plugin_whose_module_does_not_import_names_its_import_error(tmp_path, monkeypatch, capsys):
    site = tmp_path / "site"
    dist = site / "broken_lamps-0.1.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: broken-lamps\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[eto_train.envs]\nbrokenlamps = broken_lamps:LampsEnv\n")
    (site / "broken_lamps.py").write_text("import lamp_hardware_sdk_h37  # not installed\n")
    monkeypatch.syspath_prepend(str(site))
    code, err = cli_run(monkeypatch, capsys, "experts", tmp_path, "env=brokenlamps")
    assert code == 2 and "Traceback" not in err and "Could not find" not in err
    assert err.startswith("eto-train experts: PluginImportError: env=brokenlamps: the installed plug-in "
                          "broken_lamps:LampsEnv (entry point group 'eto_train.envs') cannot be imported: "
                          "ModuleNotFoundError: No module named 'lamp_hardware_sdk_h37'")


def test_splits_named_by_the_config_must_exist_before_anything_runs(tmp_path, monkeypatch, capsys):
    code, err = cli_run(monkeypatch, capsys, "eval", tmp_path, "env=agentgym_webshop")
    assert code == 2 and "Traceback" not in err and "KeyError" not in err
    assert err.startswith("eto-train eval: MissingSplit: eval.splits=[seen, unseen]: the environment 'agentgym' has "
                          "no split 'unseen' (its splits: dev, seen, train); e.g. eval.splits=[seen]. Nothing was run")
    assert not (tmp_path / "runs" / "r" / "eval").exists()
    code, err = cli_run(monkeypatch, capsys, "eto-iter", tmp_path, "env=badlamps", "eto.explore.split=training")
    assert code == 2 and err.startswith("eto-train eto-iter: MissingSplit: eto.explore.split=training: the "
                                        "environment 'lamps' has no split 'training' (its splits: dev, seen, train, "
                                        "unseen)")
