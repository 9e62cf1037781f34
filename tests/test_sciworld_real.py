"""ScienceWorld on the real model (issue 55): the action-only prompt profile (the paper's instruction, its example
without thoughts: one shape with the gold demonstrations BC trains on), the paper's metric (average final score
0-100) with paired differences, per task type, hand-checked, and a study's results kept piece by piece."""

from __future__ import annotations

import json
import lzma
import re
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from eto_train import layout, results
from eto_train.evaluation import (SCORE_MIN_N, demonstrated_tasks, score_comparison, score_markdown,
                                  without_demonstrations)
from eto_train.prompting import PromptConfig, parse_action, rollout_context, system_message
from eto_train.records import Episode, PolicyRef, Step, to_messages
from eto_train.store import append_episodes, write_json

ROOT = Path(__file__).resolve().parents[1]
ACTION_TURN = re.compile(r"^Action: [^\n]+$")  # one line, an action: the shape of every assistant turn


def _profile(name: str) -> PromptConfig:
    return PromptConfig(**OmegaConf.to_container(OmegaConf.load(ROOT / "configs" / "prompt" / f"{name}.yaml")))


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    from transformers import AutoTokenizer

    out = tmp_path_factory.mktemp("smollm2")
    src = ROOT / "tests" / "data" / "tokenizers" / "smollm2"  # SmolLM2's real tokenizer (compressed)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (out / name).write_bytes(lzma.decompress((src / f"{name}.xz").read_bytes()))
    return AutoTokenizer.from_pretrained(out)


# -- the prompt profile ------------------------------------------------------------------------------------------
def test_the_action_only_profile_is_the_papers_without_thoughts():
    paper, ours = _profile("sciworld_eto"), _profile("sciworld_eto_actions")
    assert ours.version == "sciworld-eto-actions" != paper.version  # a departure, named
    assert not ours.thought and paper.thought
    for key in ("system", "opening", "task_template", "observation_template", "invalid_format"):
        assert getattr(ours, key) == getattr(paper, key)  # the authors' instruction and turns, word for word
    assert [m["role"] for m in ours.example] == [m["role"] for m in paper.example]
    for theirs, mine in zip(paper.example, ours.example):
        if mine["role"] == "user":
            assert mine == theirs
        else:  # their answer's Action line alone; the thought is gone
            assert ACTION_TURN.match(mine["content"]) and "Thought" not in mine["content"]
            assert theirs["content"].splitlines()[-1] == mine["content"]
            assert parse_action(mine["content"]) == parse_action(theirs["content"])


def _gold_like_episode(prompt: PromptConfig) -> Episode:
    """An expert episode as experts.expert_episode writes one (format_action, render_observation), by hand."""
    from eto_train.experts import EXPERT
    from eto_train.prompting import first_user_message, format_action, render_observation

    ep = Episode(episode_id="e", task_id="8_0", env="sciworld", game="task-3-find-animal", fold="train", seed=0,
                 split="train", env_version="x", policy=EXPERT, prompt_version=prompt.version,
                 system=system_message(prompt, ["look around"])["content"], opening=prompt.opening,
                 first_user=first_user_message(prompt, "Your task is to find a(n) animal.", "ignored")["content"],
                 instruction="Your task is to find a(n) animal.", first_observation="This room is called the hallway.")
    for i, (action, obs) in enumerate([("teleport to outside", "You teleport to the outside."),
                                       ("look around", "This room is called the outside. In it, you see: \n\ta frog egg"),
                                       ("focus on frog egg", "You focus on the frog egg.")]):
        ep.steps.append(Step(index=i, raw_output=format_action(action), action=action, valid=True,
                             observation=render_observation(prompt, obs), reward=(i + 1) / 3, done=i == 2))
    ep.finish("success")
    return ep


def test_demonstrations_and_the_example_have_one_shape_in_the_rendered_conversation(tok):
    """What BC trains on (to_messages: no example) and what a policy sees (the example, then the task): every
    assistant turn is one Action line, the labelled tokens of BC are exactly those turns, nothing says Thought."""
    from eto_train.prompting import chat_ids
    from eto_train.training.masks import assistant_token_mask

    prompt = _profile("sciworld_eto_actions")
    ep = _gold_like_episode(prompt)
    demo = to_messages(ep)
    assert demo[:2] == [{"role": "user", "content": prompt.system}, {"role": "assistant", "content": "OK"}]
    answers = [m["content"] for m in demo[2:] if m["role"] == "assistant"]
    assert answers == ["Action: teleport to outside", "Action: look around", "Action: focus on frog egg"]
    example = [m["content"] for m in prompt.example if m["role"] == "assistant"]
    assert all(ACTION_TURN.match(a) for a in answers + example)
    # the rendered rollout conversation: opening, the example, the task, the demonstration's exchanges
    conv = rollout_context(prompt, ep.system, ep.first_user) + demo[3:]
    text = tok.decode(chat_ids(tok, conv, add_generation_prompt=False))
    assert "Thought" not in text.split(prompt.system)[-1]  # the instruction's own words aside, none anywhere
    turns = re.findall(r"<\|im_start\|>assistant\n(.*?)<\|im_end\|>", text, re.S)
    assert turns == ["OK", *example, *answers]
    # BC's labels: the demonstration's answers (and the opening's OK), each with its end of turn, nothing else
    ids, mask = assistant_token_mask(tok, demo)
    labelled = tok.decode([i for i, m in zip(ids, mask) if m])
    assert labelled == "OK<|im_end|>" + "".join(f"{a}<|im_end|>" for a in answers)


# -- the paper's metric ------------------------------------------------------------------------------------------
T = [f"{g}_{v}" for g in (8, 9) for v in range(6)]  # two task types, six variations each


def _episodes(path: Path, scored: dict[str, tuple[float, bool]]) -> None:
    """Hand-built episodes: task id -> (final score 0-1, success)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    eps = []
    for i, (t, (score, won)) in enumerate(scored.items()):
        ep = Episode(episode_id=f"e-{t}", task_id=t, env="sciworld", game=f"type-{t.split('_')[0]}", fold="test",
                     seed=i, split="seen", env_version="x", policy=PolicyRef("p"), prompt_version="x", system="",
                     first_user="", instruction="", first_observation="")
        ep.steps.append(Step(index=0, raw_output="Action: look around", action="look around", valid=True,
                             observation="o", reward=score, done=True))
        ep.finish("success" if won else "failure")
        eps.append(ep)
    append_episodes(path, eps)


# scores (0-1) by hand: untuned near zero, BC some, ETO more; ETO wins 8_0 and 9_0 (score 1)
UNTUNED = {t: (0.0 if i % 2 else 0.1, False) for i, t in enumerate(T)}
BC = {t: (0.5 if t.startswith("8") else 0.25, t == "8_1") for t in T}
BC["8_1"] = (1.0, True)
ETO = {**BC, "8_0": (1.0, True), "9_0": (1.0, True), "9_5": (0.0, False)}


def test_score_comparison_is_the_papers_average_final_score_with_paired_differences(tmp_path):
    files = {}
    for name, scored in (("untuned", UNTUNED), ("bc", BC), ("eto", ETO)):
        files[name] = layout.episodes(tmp_path / name, "seen")
        _episodes(files[name], scored)
    res = score_comparison(files, 500, 0)
    pol = res["policies"]
    # by hand: untuned 6 x 10 / 12 = 5.0; BC (5 x 50 + 100 + 6 x 25) / 12 = 41.666...; ETO = BC + (50 + 75 - 25) / 12
    assert pol["untuned"]["mean_score"] == pytest.approx(5.0)
    assert pol["bc"]["mean_score"] == pytest.approx(500 / 12)
    assert pol["eto"]["mean_score"] == pytest.approx(600 / 12)
    assert pol["bc"]["success"] == pytest.approx(1 / 12) and pol["eto"]["success"] == pytest.approx(3 / 12)
    lo, hi = pol["eto"]["mean_score_ci95"]
    assert lo < 50 < hi and 0 <= lo and hi <= 100
    assert list(res["pairs"]) == ["bc - untuned", "eto - untuned", "eto - bc"]
    d = res["pairs"]["eto - bc"]
    assert d["n"] == 12 and d["score_diff"] == pytest.approx(100 / 12)  # +50 (8_0) +75 (9_0) -25 (9_5)
    assert d["success_diff"] == pytest.approx(200 / 12) and d["mcnemar_p"] == pytest.approx(0.5)  # 2 discordant
    assert d["score_diff_ci95"][0] <= d["score_diff"] <= d["score_diff_ci95"][1]
    # per task type: type-8 ETO - BC = +50 / 6; type-9 = (+75 - 25) / 6
    g8, g9 = res["per_game"]["type-8"], res["per_game"]["type-9"]
    assert g8["pairs"]["eto - bc"]["score_diff"] == pytest.approx(50 / 6)
    assert g9["pairs"]["eto - bc"]["score_diff"] == pytest.approx(50 / 6)
    assert g8["policies"]["bc"]["mean_score"] == pytest.approx((250 + 100) / 6)
    assert 6 >= SCORE_MIN_N and "score_diff_ci95" in g8["pairs"]["eto - bc"]
    assert set(res["behaviour"]["bc"]) >= {"unparsed_rate", "invalid_action_rate", "loop_rate"}
    md = score_markdown({"seen": res})
    assert "| eto - bc | 12 | +8.3 [" in md and "| bc | 12 | 41.7 [" in md and "| type-8 | 6 |" in md


def test_one_policy_alone_gets_its_tables_without_empty_columns(tmp_path):
    """A study's first piece has the untuned model alone: no difference table, and the per-type table has as many
    cells as its header (it once ended each row with an empty column)."""
    files = {"untuned": layout.episodes(tmp_path / "untuned", "seen")}
    _episodes(files["untuned"], BC)
    md = score_markdown({"seen": score_comparison(files, 200, 0)})
    assert "| difference |" not in md and "|  |" not in md
    rows = [ln for ln in md.splitlines() if ln.startswith("| type-") or ln.startswith("| task type")]
    assert rows[0] == "| task type | n | untuned score |" and all(r.count("|") == 4 for r in rows)


def test_a_task_type_under_the_minimum_gets_no_interval(tmp_path):
    few = {t: v for t, v in BC.items() if t in ("8_0", "8_1", "9_0")}
    files = {"bc": layout.episodes(tmp_path / "bc", "seen"), "eto": layout.episodes(tmp_path / "eto", "seen")}
    _episodes(files["bc"], few)
    _episodes(files["eto"], {t: ETO[t] for t in few})
    res = score_comparison(files, 200, 0)
    assert "score_diff_ci95" not in res["per_game"]["type-8"]["pairs"]["eto - bc"]
    assert res["per_game"]["type-8"]["pairs"]["eto - bc"]["score_diff"] == pytest.approx(25.0)  # (+50 + 0) / 2
    assert "score_diff_ci95" in res["pairs"]["eto - bc"]  # overall: 3 tasks, still an interval


class _Lists:
    """An environment's task lists alone (all demonstrated_tasks reads): split -> ScienceWorld task ids."""

    def __init__(self, **ids: list[str]) -> None:
        self.ids = ids

    def tasks(self, split: str) -> list:
        from eto_train.envs.scienceworld import SciWorldTask

        return [SciWorldTask("sciworld", f"type-{t.split('_')[0]}", "x", int(t.split("_")[1]), split,
                             number=int(t.split("_")[0])) for t in self.ids[split]]


def test_the_seen_table_without_its_demonstrations_is_the_same_comparison_on_the_other_tasks(tmp_path):
    """2 of 12 seen tasks are demonstrations: excluded by id, counted and named; the rest compared by the same
    function (the same numbers as a split that never held the two), checked against a hand computation."""
    # two of the twelve seen tasks are also demonstrations (the train list repeats them; 9_0 twice), others not
    env = _Lists(train=["8_0", "8_20", "9_21", "9_0", "9_0"], seen=T, unseen=["8_40", "9_40"])
    assert demonstrated_tasks(env, "seen") == ["8_0", "9_0"] and demonstrated_tasks(env, "unseen") == []
    files, rest = {}, {}
    for name, scored in (("untuned", UNTUNED), ("bc", BC), ("eto", ETO)):
        files[name] = layout.episodes(tmp_path / "all" / name, "seen")
        _episodes(files[name], scored)
        rest[name] = layout.episodes(tmp_path / "rest" / name, "seen")
        _episodes(rest[name], {t: v for t, v in scored.items() if t not in ("8_0", "9_0")})
    full = score_comparison(files, 500, 0)
    res = without_demonstrations(files, demonstrated_tasks(env, "seen"), 500, 0)
    assert (res["tasks"], res["excluded"], res["excluded_ids"]) == (12, 2, ["8_0", "9_0"])
    assert {k: v for k, v in res.items() if k not in ("tasks", "excluded", "excluded_ids")} == score_comparison(
        rest, 500, 0)
    assert without_demonstrations(files, ["9_0", "8_99", "8_0"], 500, 0) == res  # one not played: nothing to leave out
    assert full == score_comparison(files, 500, 0) and full["policies"]["bc"]["n"] == 12  # the full table as it was
    pol = res["policies"]
    # by hand, on the 10 others: untuned 8_2 8_4 9_2 9_4 at 10 -> 40 / 10; BC 100 (8_1) + 4 x 50 + 5 x 25 = 425 / 10;
    # ETO = BC there but 9_5 at 0 (-25): 400 / 10 (its wins on 8_0 and 9_0 are the two left out)
    assert [pol[n]["n"] for n in pol] == [10, 10, 10]
    assert pol["untuned"]["mean_score"] == pytest.approx(4.0)
    assert pol["bc"]["mean_score"] == pytest.approx(42.5) and pol["eto"]["mean_score"] == pytest.approx(40.0)
    assert pol["bc"]["success"] == pytest.approx(0.1) == pol["eto"]["success"]
    d = res["pairs"]["eto - bc"]
    assert d["n"] == 10 and d["score_diff"] == pytest.approx(-2.5) and d["success_diff"] == pytest.approx(0.0)
    assert d["mcnemar_p"] == pytest.approx(1.0)  # no discordant task left (the full table: 2, p 0.5)
    assert res["pairs"]["bc - untuned"]["score_diff"] == pytest.approx(38.5)
    assert res["per_game"]["type-8"]["pairs"]["eto - bc"]["score_diff"] == pytest.approx(0.0)  # 5 tasks: 8_1..8_5
    assert res["per_game"]["type-9"]["pairs"]["eto - bc"]["score_diff"] == pytest.approx(-5.0)  # -25 / 5
    md = score_markdown({"seen": {**full, "without_demonstrations": res}, "unseen": full})
    assert "2 of the 12 seen tasks are also BC demonstrations" in md
    assert "### seen without demonstrations" in md and ": 8_0, 9_0." in md
    assert "| eto - bc | 10 | -2.5 [" in md and "| bc | 10 | 42.5 [" in md and "| eto - bc | 12 | +8.3 [" in md
    assert "unseen without" not in md and md.count("BC demonstrations") == 2


# -- a study in pieces: each piece collected as it ends, the scores from the results folder ----------------------
def _run(tmp_path: Path, with_eto: bool) -> Path:
    run = tmp_path / "run"
    for split in ("seen", "unseen"):
        _episodes(layout.episodes(run / "eval" / "untuned", split), UNTUNED)
        _episodes(layout.episodes(run / "eval" / "bc", split), BC)
    if with_eto:
        for split in ("seen", "unseen"):
            _episodes(layout.episodes(run / "eval" / "eto_best", split), ETO)
        write_json(run / "eto" / "result.json", {"best_eval": str(run / "eval" / "eto_best"), "best_iteration": 1,
                                                 "best_vs_bc": {}})
    return run


def test_pieces_are_collected_before_eto_ends_and_scored_from_the_folder(tmp_path):
    from eto_train.errors import ConfigError

    paths = {"bc": "bc", "bc_eval": "eval/bc", "eto": "eto", "compare": "compare"}
    run, kept = _run(tmp_path, with_eto=False), tmp_path / "kept"
    with pytest.raises(ConfigError, match="no finished compare.json or eto/result.json"):
        results.collect(run, kept / "seed0" / "p1-bc", 0, "p1-bc", paths)  # a study's unit: not before it ends
    assert results.collect(run, kept / "seed0" / "p1-bc", 0, "p1-bc", paths, partial=True) == "collected"
    with pytest.raises(ConfigError, match="nor an evaluation"):
        results.collect(tmp_path / "empty", kept / "seed0" / "x", 0, "x", paths, partial=True)
    run = _run(tmp_path, with_eto=True)
    assert results.collect(run, kept / "seed0" / "p2-eto", 0, "p2-eto", paths, partial=True) == "collected"
    table = results.scores(kept, ["seen", "unseen"], 300, 0)
    assert list(table) == ["seed0/p1-bc", "seed0/p2-eto"]
    assert list(table["seed0/p1-bc"]["seen"]["policies"]) == ["untuned", "bc"]  # the evaluations so far
    last = table["seed0/p2-eto"]["unseen"]  # read from the compressed copies alone
    assert list(last["policies"]) == ["untuned", "bc", "eto"]
    assert last["pairs"]["eto - bc"]["score_diff"] == pytest.approx(100 / 12)
    assert last["pairs"]["bc - untuned"]["score_diff"] == pytest.approx(500 / 12 - 5.0)
    assert all("without_demonstrations" not in by_split for by_split in table["seed0/p2-eto"].values())
    js, md = results.write_scores(kept, table, 300)
    assert json.loads(js.read_text())["seed0/p2-eto"]["seen"]["policies"]["eto"]["n"] == 12
    assert "## seed0/p2-eto" in md.read_text() and "average score (0-100)" in md.read_text()
    # the seen tasks that are also demonstrations: the seen table says so, and gives the same without them
    table = results.scores(kept, ["seen", "unseen"], 300, 0, {"seen": ["9_0", "8_0"], "unseen": []})
    assert "without_demonstrations" not in table["seed0/p2-eto"]["unseen"]
    js, md = results.write_scores(kept, table, 300)
    seen = json.loads(js.read_text())["seed0/p2-eto"]["seen"]
    assert seen["policies"]["eto"]["n"] == 12 and seen["without_demonstrations"]["policies"]["eto"]["n"] == 10
    less = seen["without_demonstrations"]
    assert (less["excluded"], less["excluded_ids"]) == (2, ["8_0", "9_0"])
    assert less["pairs"]["eto - bc"]["score_diff"] == pytest.approx(-2.5)
    assert md.read_text().count("### seen without demonstrations") == 2  # both units


# -- the experiment and its command ------------------------------------------------------------------------------
def test_the_experiment_is_typed_and_plays_enough_of_each_split():
    """experiment=real_sciworld passes the schema; its 11 task types give >= 300 stratified demonstrations, >= 100
    seen and >= 100 unseen variations, a dev split carved from train and disjoint from both, the paper's step limits
    (10-30), the action-only profile, one ETO iteration selected on dev by the paper's metric."""
    from collections import Counter

    from hydra import compose, initialize_config_dir

    from eto_train.config import load
    from eto_train.envs import make_env

    with initialize_config_dir(str(ROOT / "configs"), version_base="1.3", job_name="test_sciworld_real"):
        cfg = load(compose("config", overrides=["experiment=real_sciworld"]))
    assert cfg.prompt.version == "sciworld-eto-actions" and cfg.model.name == "smollm2-135m-instruct"
    assert cfg.env.metric == "mean_score" and cfg.env.step_limit is None and list(cfg.eval.splits) == ["seen", "unseen"]
    assert cfg.eto.iterations >= 1 and cfg.eto.early_stopping and cfg.eto.dev_split == "dev"
    assert cfg.results.dir == "docs/results/real_sciworld" and cfg.results.partial
    assert cfg.model.dtype == "float32" and not cfg.bc.bf16 and not cfg.eto.dpo.bf16
    env = make_env(cfg.env.plain())  # task lists only: no simulator starts
    try:
        split = {s: env.tasks(s) for s in ("train", "dev", "seen", "unseen")}
        types = set(cfg.env.tasks)
        assert len(types) == 11 and all(10 <= env.max_steps(t) <= 30 for t in split["seen"])
        assert len(split["train"]) >= 300 and len(split["seen"]) >= 100 and len(split["unseen"]) >= 100
        per_type = Counter(t.game for t in split["train"])
        assert set(per_type) == types and max(per_type.values()) == 34  # stratified: at most 36 - 2 (dev) a type
        ids = {s: {t.task_id for t in ts} for s, ts in split.items()}
        assert not ids["dev"] & (ids["seen"] | ids["unseen"] | ids["train"]) and len(ids["dev"]) == 22
        assert {t.game for t in split["seen"]} == {t.game for t in split["unseen"]} == types
        assert (len(split["seen"]), len(split["unseen"])) == (101, 103)  # the rule's counts
    finally:
        env.close()
    # the rule: "10 of the 101 seen variations are also demonstrations"; none of the unseen. From the lists, as the
    # results stage computes it for scores.md
    from eto_train.stages.results import demonstrated

    demo = demonstrated(cfg, list(cfg.eval.splits))
    assert len(demo["seen"]) == 10 and demo["unseen"] == []
    assert set(demo["seen"]) <= ids["seen"] & ids["train"]
    script = (ROOT / "lab" / "sciworld_real.sh").read_text()
    assert 'PIECES="untuned bc bc-test eto eto-test"' in script and "experiment=real_sciworld" in script
    assert "eto-train results $A results.unit=" in script


def test_every_piece_command_passes_the_schema():
    """Each `eto-train <stage> $A ...` line of lab/sciworld_real.sh, with the experiment's overrides, is a config the
    schema accepts: a piece must not fail on its config after the pieces before it have run (the bc piece's BC-on-dev
    play once did, after BC's 40 minutes)."""
    from hydra import compose, initialize_config_dir

    from eto_train.config import load

    script = (ROOT / "lab" / "sciworld_real.sh").read_text()
    lines = re.findall(r"^\s+(?:[\w-]+\)\s+)?eto-train (\w[\w-]*) \$A([^;#\n]*)", script, flags=re.M)
    assert {stage for stage, _ in lines} >= {"model", "experts", "eval", "bc", "eto-iter", "eto"}, lines
    with initialize_config_dir(str(ROOT / "configs"), version_base="1.3", job_name="test_sciworld_pieces"):
        for stage, extra in lines:
            if stage == "results":  # its keys are the shell's ($u, $RESULTS_REPO): tests/test_results.py
                continue
            overrides = ["experiment=real_sciworld", *extra.replace("'", "").split()]
            cfg = load(compose("config", overrides=overrides))  # raises ConfigError on a refused value
            assert cfg.env.name == "sciworld", (stage, overrides)
