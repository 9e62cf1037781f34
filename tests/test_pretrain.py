"""`make pretrain` at toy size: seeds, transcripts, probes, the stage end to end, kill and resume.

The toy stage: two settings (the CPU default's mapreader and twc), a 1.1M-parameter Llama and
4 optimizer steps of 2 x 128 tokens. A run of `eto-train pretrain` SIGKILLed after step 3
(``ETO_TRAIN_KILL_AT=pretrain:3``; its last checkpoint is step 2's) starts in the background
when the module starts; the uninterrupted run is the stage called in this process. The killed
command is then run again and must end with the same weights and the same probe history.
"""

from __future__ import annotations

import dataclasses

import hashlib
import json
import signal
from pathlib import Path

import pytest
from omegaconf import OmegaConf
from background import Background, eto_train, one_thread_env
from fixture_settings import react_prompt

ROOT = Path(__file__).resolve().parents[1]
MAPREADER = ("mapreader", "numLocations=3,maxDistanceApart=1")
TWC = ("twc", "numLocations=1,numItemsToPutAway=1")

TOY = [
    "run_name=toy", "wandb.enabled=false", "runtime.train_threads=1",
    f"pretrain.data.settings=[{{game:{MAPREADER[0]},params:'{MAPREADER[1]}'}},{{game:{TWC[0]},params:'{TWC[1]}'}}]",
    "pretrain.data.max_tasks_per_setting=3", "pretrain.data.heldout.count=2",
    "pretrain.tokenizer.vocab_size=400",
    "pretrain.arch.hidden_size=128", "pretrain.arch.num_layers=4", "pretrain.arch.num_heads=4",
    "pretrain.arch.intermediate_size=512", "pretrain.arch.max_position_embeddings=256",
    "pretrain.train.seq_len=128", "pretrain.train.batch_size=2", "pretrain.train.max_steps=4",
    "pretrain.train.save_steps=2", "pretrain.train.logging_steps=1",
    "pretrain.probes.every=2", "pretrain.probes.max_per_probe=4", "pretrain.probes.heldout_blocks=4",
]


def compose(overrides: list[str]):
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    with initialize_config_dir(str(ROOT / "configs"), version_base="1.3", job_name="test_pretrain"):
        return hydra_compose("config", overrides=overrides)


def chatml(messages: list[dict]) -> str:
    return "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)


# -- seeds -------------------------------------------------------------------------------------

def test_pretraining_seeds_avoid_every_split_of_the_twx_config():
    from eto_train.envs import make_env
    from eto_train.pretrain.positions import pretrain_seeds
    from eto_train.pretrain.transcripts import settings_of, task_of
    from eto_train.stages.pretrain import seed_sets

    cfg = compose([])
    env_cfg = OmegaConf.to_container(cfg.env, resolve=True)
    assert set(env_cfg["splits"]) >= {"train", "dev", "seen", "unseen", "test_seen", "test_unseen"}
    seeds = seed_sets(cfg)
    # positions: none that a split uses, the dev fold never, held-out apart from training
    for name, spec in env_cfg["splits"].items():
        used = set(range(spec["start"], spec["start"] + spec["count"]))
        for part in (seeds.train, seeds.heldout):
            assert not used & set(part.get(spec["fold"], [])), name
    assert "dev" not in seeds.train and "dev" not in seeds.heldout
    for fold in seeds.heldout:
        assert not set(seeds.heldout[fold]) & set(seeds.train.get(fold, []))
    assert len(seeds.train["test"]) + len(seeds.train["train"]) == 1150  # test 0-949, train 750-799 and 850-999

    # tasks: every pretraining setting equal to a game of the env config, by (game, params, fold, seed)
    games = {(g["name"], g["params"]) for g in env_cfg["games"]}
    shared = [s for s in settings_of(OmegaConf.to_container(cfg.pretrain.data.settings)) if (s.game, s.params) in games]
    assert {(s.game, s.params) for s in shared} == games == {MAPREADER, TWC}
    params = dict(games)
    env = make_env(env_cfg)
    try:
        split_tasks = {(t.game, params[t.game], t.fold, t.seed) for split in env_cfg["splits"] for t in env.tasks(split)}
    finally:
        env.close()
    assert len(split_tasks) == 2 * sum(s["count"] for s in env_cfg["splits"].values())
    mine = {(s.game, s.params, fold, task_of(s, fold, p).seed)
            for s in shared for part in (seeds.train, seeds.heldout) for fold, ps in part.items() for p in ps}
    assert len(mine) == 2 * 1200 and not mine & split_tasks

    with pytest.raises(ValueError, match="used by an env split"):
        pretrain_seeds(env_cfg["splits"], {"fold": "train", "start": 820, "count": 10})


def test_bad_pretrain_values_stop_the_stage_before_anything_is_written(tmp_path):
    # every pretrain.* rule is the typed config's (tests/test_config.py::test_bad_pretrain_values_are_named_at_once)
    from eto_train.config import ConfigError, load
    from eto_train.stages import pretrain

    with pytest.raises(ConfigError) as err:  # typed once, at the entry point (the CLI's, here the test's)
        pretrain.run(load(compose([f"paths.runs={tmp_path}", "pretrain.arch.num_heads=7",
                                   "pretrain.data.settings=[{game:chess}]"])))
    for key in ("pretrain.arch.hidden_size=128: a multiple of pretrain.arch.num_heads=7",
                "pretrain.data.settings.0.game='chess'", "2 bad config values"):
        assert key in str(err.value), (key, str(err.value))
    assert not any(tmp_path.iterdir())


# -- transcripts -------------------------------------------------------------------------------

def test_transcripts_gold_random_detour_deterministic_in_the_policy_layout(tmp_path):
    from eto_train.model.tiny import train_tokenizer
    from eto_train.pretrain.positions import pretrain_seeds
    from eto_train.pretrain.transcripts import (GenConfig, Setting, generate, render,
                                                shard_files, transcripts_of_task)

    kinds = {"gold": 1, "random": 1, "detour": 2}
    # coin and multi-room twc: TextWorldExpress's own gold paths there change from call to call
    settings = [Setting(*MAPREADER), Setting("coin", "numLocations=6,includeDoors=1"),
                Setting("twc", "numLocations=2,numItemsToPutAway=2,includeDoors=0")]
    gen = GenConfig()
    play = lambda: [r for s in settings for pos in (0, 1)
                    for r in transcripts_of_task(s, "test", pos, kinds, gen, react_prompt(), "0")]
    rows = play()
    assert play() == rows  # deterministic
    assert [r["kind"] for r in rows[:4]] == ["gold", "random", "detour", "detour"]
    gold = [r for r in rows if r["kind"] == "gold"]
    assert all(r["success"] for r in gold)
    assert {r["gold_source"] for r in gold} == {"twx", "explorer"}
    assert any(not v for r in rows if r["kind"] == "random" for v in r["valid"])  # invalid actions and their answers
    detours = [r for r in rows if r["kind"] == "detour"]
    assert all(r["detour_steps"] > 0 for r in detours)
    by_task = {(r["game"], r["position"]): r["actions"] for r in gold}
    assert all(r["actions"] != by_task[(r["game"], r["position"])] for r in detours)
    assert sum(r["success"] for r in detours) >= len(detours) // 2  # the gold path resumed or replanned
    assert any(r["replanned"] for r in detours if r["game"] != "mapreader")
    for r in rows:  # the policy's chat layout, ending on the observation that answers the last action
        roles = [m["role"] for m in r["messages"]]
        assert roles == ["system", "user"] + ["assistant", "user"] * len(r["actions"])
        assert r["messages"][1]["content"].startswith("Task: ")
        assert [m["content"] for m in r["messages"][2::2]] == [f"Action: {a}" for a in r["actions"]]
    answers = [m["content"] for r in rows for m, v in zip(r["messages"][3::2], r["valid"]) if not v]
    assert any(a.startswith("Unknown action") for a in answers)  # what the game says to an invalid action
    tok = train_tokenizer([m["content"] for r in rows for m in r["messages"]], vocab_size=300, min_frequency=1)
    text = render(tok, rows[0]["messages"])
    assert text.startswith("<|im_start|>system\n") and "<|im_start|>assistant\nAction: look around<|im_end|>" in text

    # shards: the same bytes in this process and in two worker processes (one JVM each); a lost
    # shard is rewritten identically on resume
    seeds = pretrain_seeds({"train": {"fold": "train", "start": 0, "count": 750}}, {"fold": "test", "start": 998, "count": 1})
    args = ([Setting(*MAPREADER), Setting(*TWC)], seeds, kinds, gen, dataclasses.asdict(react_prompt()), 0, 2)
    for d, workers in (("a", 1), ("b", 2)):
        generate(tmp_path / d, *args, max_tasks=3, workers=workers)
    files = lambda d: {p.name: p.read_bytes() for p in sorted((tmp_path / d).iterdir())}
    assert files("a") == files("b") and len(shard_files(tmp_path / "a", "train")) == 3
    (tmp_path / "b" / "train-00001.jsonl").unlink()
    generate(tmp_path / "b", *args, max_tasks=3, resume=True)
    assert files("a") == files("b")


# -- probes ------------------------------------------------------------------------------------

def _toy_transcripts() -> list[dict]:
    """A mapreader transcript with two moves whose destination the text named, and a twc one."""
    shower = "You are in the shower. There is also a box.\nTo the South you see the bar. To the West you see the kitchenette."
    bar = "You are in the bar. You also see a coin.\nTo the North you see the shower."
    room = {"id": "mapreader/x", "game": "mapreader", "actions": ["move south", "take coin", "move north"], "messages": [
        {"role": "system", "content": "Actions you can use: move <direction>."},
        {"role": "user", "content": f"Task: take the coin.\nObservation: {shower}"},
        {"role": "assistant", "content": "Action: move south"}, {"role": "user", "content": bar},
        {"role": "assistant", "content": "Action: take coin"}, {"role": "user", "content": "You take the coin."},
        {"role": "assistant", "content": "Action: move north"}, {"role": "user", "content": shower}]}
    kitchen = "You are in the kitchen. There is a fridge that is closed. You also see a notebook."
    obj = {"id": "twc/x", "game": "twc", "actions": ["look around", "take notebook"],
           "valid_actions": [["look around", "take notebook"], ["look around", "take notebook"]], "messages": [
        {"role": "system", "content": "Actions you can use: take <object>."},
        {"role": "user", "content": f"Task: put things away; the sugar is elsewhere.\nObservation: {kitchen}"},
        {"role": "assistant", "content": "Action: look around"}, {"role": "user", "content": kitchen},
        {"role": "assistant", "content": "Action: take notebook"}, {"role": "user", "content": "You take the notebook."}]}
    vocab_extra = {"id": "twc/y", "game": "twc", "actions": ["take sugar"], "valid_actions": [["take sugar"]],
                   "messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "You are in the pantry."},
                                {"role": "assistant", "content": "Action: take sugar"}, {"role": "user", "content": "You take the sugar."}]}
    return [room, obj, vocab_extra]


class Stub:
    """A 'model' that always names ``pick(context)``: in its log-probabilities and greedily."""

    def __init__(self, pick):
        self.pick = pick

    def logprobs(self, context, continuations):
        return [0.0 if c.strip().rstrip(".").replace("<|im_end|>", "") == self.pick(context) else -5.0
                for c in continuations]

    def greedy(self, context, max_new_tokens=8):
        return " " + self.pick(context)


def test_probes_score_a_stub_that_is_right_or_wrong():
    from eto_train.pretrain.probes import build_probes, run_probes

    probes = build_probes(_toy_transcripts(), chatml)
    rooms = [p for p in probes if p.probe == "room"]
    objects = [p for p in probes if p.probe == "object"]
    assert [p.answer for p in rooms] == ["bar", "shower"]
    assert rooms[0].context.endswith("Action: move south<|im_end|>\n<|im_start|>user\nYou are in the")
    assert rooms[0].mentioned == ["bar", "kitchenette", "shower"] and rooms[0].end == "."
    # the twc take at the pantry names sugar, which lies there; the kitchen's take: the notebook
    kitchen = [p for p in objects if p.id.startswith("twc/x")]
    assert len(kitchen) == 1 and kitchen[0].in_room == ["notebook"] and kitchen[0].names == ["notebook", "sugar"]
    assert kitchen[0].mentioned == ["notebook", "sugar"] and kitchen[0].context.endswith("<|im_start|>assistant\nAction: take")

    behind = lambda ctx: "bar" if ctx.rfind("move south") > ctx.rfind("move north") else "shower"
    right = run_probes(Stub(behind), rooms + kitchen)
    assert right["room"]["accuracy"] == right["room"]["accuracy_mentioned"] == 1.0
    assert right["room"]["chance_majority"] == 0.5 and right["room"]["chance_uniform_mentioned"] == pytest.approx(1 / 3)
    wrong = run_probes(Stub(lambda ctx: "kitchenette"), rooms)
    assert wrong["room"]["accuracy"] == wrong["room"]["accuracy_mentioned"] == 0.0
    obj_right = run_probes(Stub(lambda ctx: "notebook"), kitchen)["object"]
    assert obj_right["in_room"] == obj_right["in_room_mentioned"] == obj_right["in_room_greedy"] == 1.0
    assert obj_right["chance_uniform"] == obj_right["chance_uniform_mentioned"] == 0.5
    obj_wrong = run_probes(Stub(lambda ctx: "sugar"), kitchen)["object"]
    assert obj_wrong["in_room"] == obj_wrong["in_room_mentioned"] == obj_wrong["in_room_greedy"] == 0.0


def test_lm_scorer_equals_a_full_forward_per_candidate():
    import torch

    from eto_train.model.tiny import build_tiny_model, train_tokenizer
    from eto_train.pretrain.probes import LMScorer

    texts = [m["content"] for t in _toy_transcripts() for m in t["messages"]] * 5
    tok = train_tokenizer(texts, vocab_size=300, min_frequency=1)
    model = build_tiny_model(tok, hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64,
                             max_position_embeddings=512, seed=0)
    context = chatml(_toy_transcripts()[0]["messages"][:3]) + "<|im_start|>user\nYou are in the"
    conts = [" bar.", " shower.", " kitchenette.", " x."]
    fast = LMScorer(model, tok, chunk=3).logprobs(context, conts)
    n = len(tok(context, add_special_tokens=False)["input_ids"])
    for c, got in zip(conts, fast):
        ids = tok(context + c, add_special_tokens=False)["input_ids"]
        with torch.no_grad():
            lp = torch.log_softmax(model(input_ids=torch.tensor([ids])).logits[0].float(), -1)
        assert got == pytest.approx(sum(float(lp[j - 1, ids[j]]) for j in range(n, len(ids))), abs=1e-4)
    assert isinstance(LMScorer(model, tok).greedy(context, 3), str)


# -- the stage ---------------------------------------------------------------------------------

class Run(Background):
    """`eto-train pretrain` in the background (tests/background.py)."""

    def __init__(self, runs: Path, log: Path, kill_at: str | None = None):
        self.dir = runs / "toy" / "pretrain"
        super().__init__(eto_train("pretrain", f"paths.runs={runs}", *TOY), log, one_thread_env(kill_at))


@pytest.fixture(scope="module", autouse=True)
def killed(tmp_path_factory):
    """A toy run SIGKILLed after optimizer step 3 (its checkpoint is step 2's), started when the
    module starts, so that it runs alongside the tests before the ones that need it."""
    runs = tmp_path_factory.mktemp("killed")
    run = Run(runs, runs / "log", kill_at="pretrain:3")
    yield runs, run
    run.stop()


@pytest.fixture(scope="module")
def whole(tmp_path_factory):
    """The same toy run, uninterrupted, in this process (as `make pretrain` runs it)."""
    from eto_train.config import load
    from eto_train.stages import pretrain

    runs = tmp_path_factory.mktemp("whole")
    pretrain.run(load(compose([f"paths.runs={runs}", *TOY])), command="eto-train pretrain <toy overrides>")
    return runs / "toy" / "pretrain"


def _weights(model_dir: Path) -> str:
    return hashlib.sha256((model_dir / "model.safetensors").read_bytes()).hexdigest()


def _probe_history(stage_dir: Path) -> list[dict]:
    rows = json.loads((stage_dir / "probes.json").read_text())["history"]
    return [{k: v for k, v in r.items() if k != "probe/seconds"} for r in rows]


def test_pretrain_stage_writes_a_loadable_base_with_card_and_probes(whole):
    from eto_train.model.load import load_model, load_tokenizer

    out = whole
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["status"] == "done" and manifest["metrics"]["optimizer_steps"] == 4
    assert manifest["metrics"]["tokens_seen"] == 4 * 2 * 128 and manifest["metrics"]["tokens_per_second"] > 0
    assert [p["step"] for p in manifest["metrics"]["probes"]] == [0, 2, 4]
    last = manifest["metrics"]["final_probes"]
    assert last["probe/room/n"] > 0 and last["probe/object/n"] > 0 and last["probe/heldout_loss"] > 0
    assert 0 <= last["probe/room/accuracy"] <= 1 and 0 < last["probe/room/chance_uniform_mentioned"] <= 1
    data = json.loads((out / "data" / "manifest.json").read_text())
    assert set(data["summary"]["train"]["by_kind"]) == {"gold", "random", "detour"}
    assert data["summary"]["train"]["tasks"] == 2 * 3 and data["summary"]["heldout"]["tasks"] == 2 * 2
    tokens = json.loads((out / "tokens" / "manifest.json").read_text())["metrics"]
    assert tokens["vocab_size"] == 400 and tokens["train_tokens"] > 1000

    model_dir = out / "model"
    tok, model = load_tokenizer(str(model_dir)), load_model(str(model_dir), dtype="float32")
    assert 1e6 < sum(p.numel() for p in model.parameters()) < 2e6
    ids = tok.apply_chat_template([{"role": "user", "content": "Task: x"}], add_generation_prompt=True, return_tensors="pt")
    ids = ids["input_ids"] if hasattr(ids, "keys") else ids
    assert model.generate(ids, max_new_tokens=2, do_sample=False).shape[1] == ids.shape[1] + 2
    card = (model_dir / "MODEL_CARD.md").read_text()
    for needle in ("eto-train pretrain <toy overrides>", "| detour |", "| gold |", "| random |", "optimizer steps",
                   "![loss curve](loss.png)", "Reading probes", "| 4 | 1,024 |", "mapreader", "tokens/s"):
        assert needle in card, needle
    assert f"- `model.safetensors` `{_weights(model_dir)}`" in card  # a rebuild is checked against the card
    assert (model_dir / "loss.png").stat().st_size > 1000
    progress = json.loads((out / "progress.json").read_text())
    assert progress["step"] == 4 and progress["last_probe"]["step"] == 4


def test_a_kill_mid_training_resumes_to_the_same_weights(whole, killed):
    runs, run = killed
    rc, log = run.wait()
    out = run.dir
    assert rc == -signal.SIGKILL, log[-4000:]
    assert "ETO_TRAIN_KILL_AT=pretrain:3: SIGKILL" in log
    assert json.loads((out / "manifest.json").read_text())["status"] == "running"
    assert sorted(p.name for p in (out / "checkpoints").glob("checkpoint-*")) == ["checkpoint-2"]
    assert not (out / "model").exists()

    rc, log = Run(runs, runs / "log2").wait()  # the same command again
    assert rc == 0, log[-4000:]
    squash = "".join(log.split())
    assert "[pretrain/data]uptodate" in squash and "[pretrain/tokens]uptodate" in squash
    assert f"resumingfromthelastcheckpoint{out}/checkpoints/checkpoint-2".replace(" ", "") in squash
    assert _weights(out / "model") == _weights(whole / "model")
    assert _probe_history(out) == _probe_history(whole)
    assert json.loads((out / "manifest.json").read_text())["metrics"]["resumed_from"] == "checkpoint-2"
