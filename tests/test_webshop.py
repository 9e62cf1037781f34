"""WebShop adapter (envs/webshop.py) against the fake shop of tests/fake_webshop.py, and the
pipeline (experts -> bc -> one ETO iteration -> eval) with env=webshop on it at toy size."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import fake_webshop
from eto_train.envs import make_env
from eto_train.envs.base import EnvironmentFailure
from eto_train.envs.webshop import INVALID, WebShopEnv
from fixture_settings import env_file, react_prompt, rollout_config

ROOT = Path(__file__).resolve().parents[1]
CFG = env_file("webshop")
FAKE = "fake_webshop:WebAgentTextEnv"
GOAL0 = fake_webshop.GOALS[0]["instruction_text"]


def write_splits(d: Path) -> Path:
    """Small ETO-style index files over the fake shop's 8 goals (train lists goal 0 twice, as
    ETO's train list repeats one goal)."""
    d.mkdir(parents=True, exist_ok=True)
    for name, idxs in {"train.json": [0, 1, 2, 3, 4, 0], "seen.json": [5, 6]}.items():
        (d / name).write_text(json.dumps(idxs))
    return d


def fake_cfg(data: Path, **over) -> dict:
    """The config file's env section on the fake shop; dev: the goal no split file lists (7)."""
    cfg = {**CFG, "text_env": FAKE, "data_dir": str(data), "dev_holdout": 0,
           "splits": {"train": "train.json", "seen": "seen.json",
                      "dev": {"not_in": ["train.json", "seen.json"], "count": 1}}}
    return {**cfg, **over}


@pytest.fixture
def env(tmp_path):
    e = make_env(fake_cfg(write_splits(tmp_path / "data")))
    yield e
    e.close()


def play(env, actions):
    return [env.step(a) for a in actions]


# -- configuration and splits -------------------------------------------------------------------
def test_config_splits_are_etos_files_and_dev_is_held_out_of_train():
    env = make_env({**CFG, "text_env": FAKE})  # the class only: the real data files, no shop built
    assert env.max_steps(None) == 10 and CFG["step_limit"] == 10 and CFG["metric"] == "mean_score"
    assert set(CFG["splits"]) == {"train", "seen"} and CFG["splits"]["seen"] == "test_indices.json"
    data = ROOT / "data" / "webshop_eto"
    files = {f: json.loads((data / f).read_text()) for f in ("train_indices.json", "test_indices.json",
                                                                 "test_indices_500.json")}
    assert [len(v) for v in files.values()] == [1824, 200, 500]  # ETO's released lists, unchanged
    train, seen, dev = env.tasks("train"), env.tasks("seen"), env.tasks("dev")
    # 1823 goals (4116 is listed twice and played once), 50 of them held out as dev
    assert len(train) == 1823 - 50 and len(dev) == CFG["dev_holdout"] == 50
    assert [t.task_id for t in seen] == [str(i) for i in files["test_indices.json"]]  # ETO's order, ids = goal index
    assert train[0].task_id == "0" and train[0].fold == "train" and seen[0].fold == "test"
    assert {t.game for t in train + seen + dev} == {"webshop"} and {t.split for t in dev} == {"dev"}
    dev_ids = {t.seed for t in dev}
    assert dev_ids <= set(files["train_indices.json"]) and not dev_ids & {t.seed for t in train}
    assert not dev_ids & set(files["test_indices.json"])  # never one of the 21 goals both lists name
    with pytest.raises(KeyError, match="no split 'unseen'"):
        env.tasks("unseen")
    # the other way to a dev split: goals that no ETO list names, the training list kept whole
    lists = list(files)
    other = make_env({**CFG, "text_env": FAKE, "dev_holdout": 0, "limit": 3,
                      "splits": {**CFG["splits"], "dev": {"not_in": lists, "count": 100}}})
    assert [t.seed for t in other.tasks("dev")] == [1, 2, 5] and len(other.tasks("seen")) == 3
    unlimited = WebShopEnv(**{**CFG, "text_env": FAKE, "splits": {"dev": {"not_in": lists, "count": 100}}})
    dev = unlimited.tasks("dev")
    listed = {i for v in files.values() for i in v}
    assert len(dev) == 100 and not {t.seed for t in dev} & listed and dev[0].fold == "unlisted"


def test_bad_split_specs_are_clear_errors(tmp_path):
    data = write_splits(tmp_path)
    with pytest.raises(ValueError, match=r"env.splits.seen: no file nope.json"):
        WebShopEnv(**fake_cfg(data, splits={"seen": "nope.json"}))
    with pytest.raises(ValueError, match=r"env.splits.dev: .* neither a file"):
        WebShopEnv(**fake_cfg(data, splits={"dev": {"count": 2, "other": 1}}))
    (data / "bad.json").write_text('{"a": 1}')
    with pytest.raises(ValueError, match="a JSON list of goal indices"):
        WebShopEnv(**fake_cfg(data, splits={"x": "bad.json"})).tasks("x")


# -- episodes -------------------------------------------------------------------------------------
def test_reset_gives_the_goal_and_the_search_page_and_the_gold_path_wins(env):
    task = env.tasks("train")[0]
    assert [t.task_id for t in env.tasks("train")] == ["0", "1", "2", "3", "4"]
    gold = env.expert_actions(task)
    # the fake writes product ids in upper case, as the released data; the adapter gives the
    # form the policy's parsed actions take
    assert gold == ["search[lavender soy candle]", "click[b0candle01]", "click[16 oz]", "click[lavender]",
                    "click[buy now]"]
    instruction, first = env.reset(task)
    assert instruction == GOAL0
    assert first.observation == f"WebShop [SEP] Instruction: [SEP] {GOAL0} [SEP] Search"  # the page text, as is
    assert (first.reward, first.done, first.success, first.valid_actions) == (0.0, False, False, None)
    results = play(env, gold)
    assert all(r.info["recognized"] for r in results)
    assert [r.reward for r in results] == [0.0] * 4 + [1.0]
    assert [r.done for r in results] == [False] * 4 + [True]
    assert results[-1].success and not results[-1].failure
    assert results[0].observation.startswith(f"Instruction: [SEP] {GOAL0} [SEP] Back to Search [SEP] Page 1")
    assert "Your score (min 0.0, max 1.0) [SEP] 1.0" in results[-1].observation
    assert "webshop==0.0-fake" in env.version and "step_limit=10" in env.version


def test_an_imperfect_purchase_is_scored_and_is_no_success(env):
    env.reset(env.tasks("train")[0])
    *_, last = play(env, ["search[soy candle]", "click[b0candle01]", "click[8 oz]", "click[buy now]"])
    # type 1 x (2 attributes + 0 of 2 options + price) / 5
    assert last.done and last.reward == pytest.approx(0.6) and not last.success and last.failure
    assert last.info["webshop_reward"] == pytest.approx(0.6)


def test_actions_the_page_does_not_offer_are_invalid(env):
    _, first = env.reset(env.tasks("train")[0])
    for action in ("click[b0candle01]", "click[search]", "buy it", "search[]"):
        r = env.step(action)
        assert not r.info["recognized"] and r.observation == first.observation and r.reward == 0.0 and not r.done
    results = play(env, ["search[soy candle]", "click[b0candle01]"])
    assert all(r.info["recognized"] for r in results)
    item = results[-1].observation
    for action in ("click[next >]", "click[b0tea00001]", "click[purple]"):  # not on an item page
        r = env.step(action)
        assert not r.info["recognized"] and r.observation == item
    # no search bar on an item page: invalid, though WebShop (and the fake) still searches
    r = env.step("search[green tea]")
    assert not r.info["recognized"] and "B0TEA00001" in r.observation
    assert env.step("click[B0TEA00001]").info["recognized"]  # the simulator folds case, so does the check


def test_a_simulator_assertion_reads_invalid_action_as_in_eto(env, monkeypatch):
    env.reset(env.tasks("train")[0])

    def boom(action):
        raise AssertionError

    monkeypatch.setattr(env._env, "step", boom)  # the text env (through the fault wrapper)
    r = env.step("click[b0candle01]")
    assert (r.observation, r.reward, r.done, r.info["recognized"]) == (INVALID, 0.0, False, False)

    def crash(action):
        raise RuntimeError("search index gone")

    monkeypatch.setattr(env._env, "step", crash)
    with pytest.raises(EnvironmentFailure, match="search index gone"):
        env.step("search[tea]")


def test_the_step_limit_ends_an_episode_of_invalid_actions(tmp_path):
    from eto_train.records import PolicyRef
    from eto_train.rollouts.loop import run_rollouts

    class Scripted:
        def generate(self, convs):
            return [("Action: click[nothing here]", 10, 3, 0) for _ in convs]

    cfg = fake_cfg(write_splits(tmp_path))
    lister = make_env(cfg)
    tasks = lister.tasks("seen")
    lister.close()
    done = []
    run_rollouts([(t, 0) for t in tasks], lambda: make_env(cfg), Scripted(),
                 PolicyRef(id="scripted"), react_prompt(), rollout_config(batch_size=2), done.append)
    assert len(done) == 2 and {e.task_id for e in done} == {"5", "6"}
    for ep in done:
        assert ep.status == "max_steps" and ep.num_steps == 10 and not ep.success
        assert not any(s.valid for s in ep.steps) and ep.steps[-1].reward == 0.0
        assert ep.instruction == fake_webshop.GOALS[int(ep.task_id)]["instruction_text"]
        assert ep.env == "webshop" and ep.env_params["max_steps"] == 10


def test_adapters_share_one_catalogue_and_keep_their_own_sessions(tmp_path):
    cfg = fake_cfg(write_splits(tmp_path), env_kwargs={"num_products": 6})  # a server of its own
    before = fake_webshop.FakeServer.created
    a, b = make_env(cfg), make_env(cfg)
    task = a.tasks("train")[0]
    a.reset(task)
    _, first_b = b.reset(task)  # the same goal, in parallel
    a.step("search[soy candle]")
    assert b.step("click[b0candle01]").observation == first_b.observation  # b is still on its search page
    assert a.step("click[b0candle01]").info["recognized"]
    assert fake_webshop.FakeServer.created == before + 1
    server = a._env.server
    assert server is b._env.server and len(server.user_sessions) >= 2
    a.close()
    b.close()
    assert not any(k.startswith((a._prefix, b._prefix)) for k in server.user_sessions)


# -- what is missing -----------------------------------------------------------------------------
def test_a_missing_webshop_package_says_what_to_install(tmp_path):
    from eto_train.envs import check_playable

    cfg = fake_cfg(write_splits(tmp_path), text_env="web_agent_site_absent.envs:WebAgentTextEnv")
    env = make_env(cfg)  # the task lists need no install (BC on imported experts)
    assert env.tasks("seen")
    with pytest.raises(ImportError) as err:
        env.reset(env.tasks("seen")[0])
    with pytest.raises(ImportError):
        check_playable(cfg)
    msg = str(err.value)
    assert "env.text_env=web_agent_site_absent.envs:WebAgentTextEnv" in msg
    assert "princeton-nlp/WebShop" in msg and "envs/webshop" in msg and "search index" in msg
    with pytest.raises(ValueError, match="not 'module:Class'"):
        make_env({**cfg, "text_env": "web_agent_site.envs.WebAgentTextEnv"})
    with pytest.raises(ImportError, match="has no class Nope"):
        check_playable({**cfg, "text_env": "fake_webshop:Nope"})


def test_missing_product_data_is_a_clear_error(tmp_path):
    env = make_env(fake_cfg(write_splits(tmp_path), env_kwargs={"file_path": str(tmp_path / "items.json")}))
    with pytest.raises(FileNotFoundError, match="product data or search index is missing"):
        env.reset(env.tasks("train")[0])


def test_without_a_gold_path_experts_must_be_imported(tmp_path):
    env = make_env(fake_cfg(write_splits(tmp_path), text_env="fake_webshop:PlainWebAgentTextEnv"))
    with pytest.raises(NotImplementedError, match=r"experts\.source"):
        env.expert_actions(env.tasks("train")[0])
    assert env.reset(env.tasks("train")[0])[0] == GOAL0  # playing needs no gold path


# -- the pipeline ----------------------------------------------------------------------------------
SIZE = [
    "wandb.enabled=false", "runtime.train_threads=1", "runtime.rollout_threads=1",
    "model.tokenizer.vocab_size=300", "model.arch.hidden_size=32", "model.arch.num_layers=1",
    "model.arch.num_heads=2", "model.arch.intermediate_size=64",
    "bc.max_steps=3", "bc.per_device_train_batch_size=4", "bc.save_steps=2",
    "rollout.batch_size=4", "rollout.generation.max_new_tokens=8", "eval.splits=[seen]",
    "eto.explore.tasks_per_game=3", "eto.explore.rollout.batch_size=3", "eto.dpo.max_steps=2", "eto.dpo.per_device_train_batch_size=2",
    "eto.dpo.logging_steps=1", "eto.dpo.loss_type=[sigmoid]", "eto.dpo.loss_weights=null",
]


def _compose(overrides: list[str]):
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(str(ROOT / "configs"), version_base="1.3", job_name="webshop"):
        return compose("config", overrides=overrides)


def _config(overrides: list[str]):
    """:func:`_compose` typed once (config.load): what a stage takes."""
    from eto_train.config import load

    return load(_compose(overrides))


def test_pipeline_experts_bc_eto_iteration_eval_on_the_fake_shop(tmp_path):
    from eto_train.stages import bc, eto, evaluate, experts, model

    data = write_splits(tmp_path / "data")
    over = ["env=webshop", f"env.text_env={FAKE}", f"env.data_dir={data}", "env.splits.train=train.json",
            "env.splits.seen=seen.json", "env.dev_holdout=1",  # dev: one training goal held out
            f"paths.runs={tmp_path / 'runs'}", "run_name=webshop", *SIZE]
    cfg = _config(over)
    experts.run(cfg)
    model.run(cfg)
    bc.run(cfg)
    k, policy = eto.latest_policy(cfg)
    summary = eto.run_iteration(cfg, k + 1, policy)
    cfg = _config(over + [f"eval.policy={summary['policy']}", "eval.tag=iter1"])
    evaluate.run(cfg)

    run = Path(cfg.paths.run)
    gold = [json.loads(x) for x in (run / "experts" / "train.jsonl").read_text().splitlines()]
    dev = json.loads((run / "eto" / "iter1" / "eval" / "dev" / "metrics.json").read_text())
    trained = [e["task_id"] for e in gold]
    assert len(trained) == 4 and set(trained) < {"0", "1", "2", "3", "4"} and {e["env"] for e in gold} == {"webshop"}
    assert all(e["status"] == "success" and e["steps"][-1]["reward"] == 1.0 for e in gold)
    goal = fake_webshop.GOALS[int(gold[0]["task_id"])]
    assert gold[0]["instruction"] == goal["instruction_text"] and gold[0]["steps"][0]["action"] == f"search[{goal['query']}]"
    b = json.loads((run / "bc" / "manifest.json").read_text())
    assert b["status"] == "done" and b["metrics"]["optimizer_steps"] == 3
    it = run / "eto" / "iter1"
    explored = [json.loads(x) for x in (it / "explore" / "episodes.jsonl").read_text().splitlines()]
    assert [e["task_id"] for e in explored] == trained[:3]
    for e in explored:  # every episode ended and carries the reward of each step
        assert e["status"] in ("success", "failure", "max_steps") and 1 <= len(e["steps"]) <= 10
        assert all(0.0 <= s["reward"] <= 1.0 for s in e["steps"])
    pairs = [json.loads(x) for x in (it / "pairs" / "pairs.jsonl").read_text().splitlines()]
    assert summary["pairs"] == len(pairs) >= 1 and all(p["chosen_policy"] == "expert" for p in pairs)
    dpo = json.loads((it / "dpo" / "manifest.json").read_text())
    assert dpo["status"] == "done" and dpo["metrics"]["optimizer_steps"] == 2
    assert (it / "dpo" / "model" / "model.safetensors").exists()
    assert summary["dev_split"] == "dev" and summary["dev"]["episodes"] == dev["overall"]["episodes"] == 1
    held_out = json.loads((it / "eval" / "dev" / "episodes.jsonl").read_text().splitlines()[0])
    assert held_out["split"] == "dev" and held_out["task_id"] not in trained  # never seen in training
    m = json.loads((run / "eval" / "iter1" / "seen" / "metrics.json").read_text())
    assert m["overall"]["episodes"] == 2 and m["policy"].startswith("iter1@") and set(m["per_game"]) == {"webshop"}
    played = [json.loads(x) for x in (run / "eval" / "iter1" / "seen" / "episodes.jsonl").read_text().splitlines()]
    assert sorted(e["task_id"] for e in played) == ["5", "6"]


def test_paper_experiment_on_the_fake_shop_with_experts_imported_from_the_released_layout(tmp_path):
    """experiment=webshop_llama2_7b on the Llama-2 fixture (real tokenizer and template): the
    authors' prompt, experts from a file in the released schema (one with a reward below 1, kept
    as the authors keep it), bc -> one eto-iter -> eval."""
    from fixture_models import build_fixture_model
    from test_rehearsal import CPU, SIZE as PAPER_SIZE, check_run, released_entries, rehearse

    from eto_train.store import read_episodes

    data = write_splits(tmp_path / "data")
    over = ["experiment=webshop_llama2_7b", f"env.text_env={FAKE}", f"env.data_dir={data}",
            "env.splits.train=train.json", "env.splits.seen=seen.json", "env.limit=2",
            f"model.path={build_fixture_model('llama2', tmp_path / 'llama2')}", f"paths.runs={tmp_path / 'runs'}",
            *[o for o in PAPER_SIZE if not o.startswith(("env.step_limit", "eval.splits"))], *CPU]
    entries = released_entries(_compose(over + ["experts.source=unused"]), thought="I think I should")
    for i, e in enumerate(entries):  # the authors' WebShop file: integer ids, each with its reward
        e.update(id=int(e["id"]), reward=1.0 if i == 0 else 0.5)
    source = tmp_path / "webshop_sft.json"
    source.write_text(json.dumps(entries, indent=4))
    out = rehearse(over + [f"experts.source={source}"])
    check_run(out)
    experts = read_episodes(out["cfg"].paths.experts)
    assert [e.final_score for e in experts] == [1.0, 0.5] and experts[0].first_user.startswith("Observation:\nWebShop [SEP]")
    bc = json.loads((Path(out["cfg"].paths.bc) / "manifest.json").read_text())
    assert bc["metrics"]["trajectories"] == 2  # the 0.5 expert is cloned too, as the authors clone their file


def test_bc_on_imported_experts_needs_no_webshop_install_and_make_eto_says_so_before_bc(tmp_path):
    """The authors' file imports for BC without WebShop; `make eto` needs it to explore and says
    what to install before it trains anything."""
    from eto_train.stages import eto, experts
    from eto_train.store import read_episodes

    conv = [{"from": "human", "value": "You are web shopping."}, {"from": "gpt", "value": "OK"},
            {"from": "human", "value": "Observation:\nWebShop [SEP] Instruction: [SEP] a mug [SEP] Search"},
            {"from": "gpt", "value": "Thought: I think I should search.\nAction: search[mug]"}]
    source = tmp_path / "webshop_sft.json"
    source.write_text(json.dumps([{"id": 0, "reward": 0.8, "conversations": conv}, {"id": 3, "conversations": conv}]))
    over = ["experiment=webshop_llama2_7b", f"experts.source={source}", f"paths.runs={tmp_path / 'runs'}",
            "env.text_env=web_agent_site_absent.envs:WebAgentTextEnv", "wandb.enabled=false"]
    cfg = _config(over)
    experts.run(cfg)
    assert [(e.task_id, e.final_score) for e in read_episodes(cfg.paths.experts)] == [("0", 0.8), ("3", 1.0)]
    with pytest.raises(ImportError, match=r"env.text_env=web_agent_site_absent.envs:WebAgentTextEnv: cannot import"):
        eto.run(cfg)
    assert not Path(cfg.paths.bc).exists()
