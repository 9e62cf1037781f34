"""Errors that name the thing (issue "Nothing written is lost", part 2).

A ``model.path`` / ``eval.policy`` that is neither a local folder nor loadable offline (a
mistyped hub id) fails with an error that names it and says how to get weights, before the hub
is asked anything; an empty experts file names the file and the stage that writes it.
"""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from eto_train.experts import read_experts
from eto_train.model import load
from eto_train.model.load import CheckpointError, check_checkpoint, load_model, load_tokenizer, policy_ref
from eto_train.records import Episode, PolicyRef
from eto_train.store import append_episodes

MISTYPED = "meta-llama/Llama-2-7b-chat-hff"
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def offline(monkeypatch, tmp_path):
    """HF_HUB_OFFLINE=1 as the Makefile sets it, an empty hub cache, and no network at all."""
    from huggingface_hub import constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))

    def no_network(*args, **kwargs):
        raise AssertionError("the check went to the network")

    monkeypatch.setattr(socket.socket, "connect", no_network)
    monkeypatch.setattr(socket, "create_connection", no_network)
    return tmp_path / "hub"


def _names_the_id_and_the_remedy(message: str) -> None:
    assert message.startswith(f"{MISTYPED}: not a local folder")
    assert f"`hf download {MISTYPED}`" in message and f"`huggingface-cli download {MISTYPED}`" in message
    assert "point model.path / eval.policy at a local checkpoint folder" in message
    assert "couldn't connect" not in message


@pytest.mark.parametrize("call", [policy_ref, load_tokenizer, load_model])
def test_a_mistyped_hub_id_offline_names_the_id_and_how_to_get_weights(offline, call):
    with pytest.raises(CheckpointError) as err:
        call(MISTYPED)
    _names_the_id_and_the_remedy(str(err.value))
    assert "HF_HUB_OFFLINE=1" in str(err.value) and str(offline) in str(err.value)


def test_the_evaluation_stage_fails_on_it_before_anything_starts(offline, tmp_path):
    from hydra import compose, initialize_config_dir

    from eto_train import config
    from eto_train.stages import evaluate

    with initialize_config_dir(config_dir=str(ROOT / "configs"), version_base="1.3"):
        cfg = config.load(compose("config", overrides=[f"paths.runs={tmp_path / 'runs'}", f"eval.policy={MISTYPED}",
                                                       "runtime.rollout_threads=1"]))  # this process keeps 1 thread
    with pytest.raises(CheckpointError) as err:
        evaluate.run(cfg)
    _names_the_id_and_the_remedy(str(err.value))
    assert not (tmp_path / "runs").exists()  # nothing written


def test_a_hub_id_in_the_local_cache_passes_the_check(offline):
    snapshot = offline / "models--org--cached-model" / "snapshots" / "abc123"
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text("{}")
    (offline / "models--org--cached-model" / "refs").mkdir()
    (offline / "models--org--cached-model" / "refs" / "main").write_text("abc123")
    check_checkpoint("org/cached-model")  # no error: transformers loads it from the cache
    assert policy_ref("org/cached-model").id == "org/cached-model@hub"


def test_the_hubs_own_error_online_is_named_too(monkeypatch):
    import transformers

    monkeypatch.setattr(load, "hub_offline", lambda: False)

    def refuse(*args, **kwargs):
        raise OSError(f"{MISTYPED} is not a local folder and is not a valid model identifier listed on "
                      f"'https://huggingface.co/models'\nIf this is a private repository, ...")

    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", refuse)
    with pytest.raises(CheckpointError) as err:
        load_tokenizer(MISTYPED)
    _names_the_id_and_the_remedy(str(err.value))
    assert "is not a valid model identifier" in str(err.value) and isinstance(err.value.__cause__, OSError)


def test_a_local_path_keeps_its_own_error(offline, tmp_path):
    with pytest.raises(CheckpointError, match="checkpoint folder not found"):
        load_tokenizer(str(tmp_path / "runs" / "demo" / "bc" / "model"))


def _episode(i: int) -> Episode:
    return Episode(episode_id=f"expert/{i}", task_id=f"t{i}", env="twx", game="g", fold="train", seed=i,
                   split="train", env_version="v", policy=PolicyRef(id="expert"), prompt_version="p",
                   system="s", first_user="u", instruction="i", first_observation="o", status="success")


def test_an_empty_experts_file_names_the_file_and_the_stage_that_writes_it(tmp_path):
    path = tmp_path / "experts" / "train.jsonl"
    path.parent.mkdir()
    path.write_text("")
    with pytest.raises(ValueError) as err:
        read_experts(path)
    msg = str(err.value)
    assert msg.startswith(f"{path}: empty experts file (0 episodes)") and "`make experts`" in msg
    assert str(path.parent / "manifest.json") in msg  # what to delete when the stage says up to date
    with pytest.raises(FileNotFoundError, match="no experts file.*`make experts`"):
        read_experts(tmp_path / "nowhere.jsonl")
    append_episodes(path, [_episode(0), _episode(1)])
    assert [e.episode_id for e in read_experts(path)] == ["expert/0", "expert/1"]


# -- checkpoint coherence (issue 26, item 4): tokenizer and weights that do not belong together --
BASE = ROOT / "models" / "twx-base-1.7m"  # 1,230 embedding rows, a 1,230-token tokenizer


def _copy_base(dst: Path) -> Path:
    import shutil

    shutil.copytree(BASE, dst, ignore=shutil.ignore_patterns("*.png", "MODEL_CARD.md"))
    return dst


@pytest.fixture
def grown_tokenizer(tmp_path):
    """The shipped base with 3,000 tokens added to its tokenizer and the embedding left as it was:
    the issue's 4,230 tokens against 1,230 rows."""
    from transformers import AutoTokenizer

    folder = _copy_base(tmp_path / "policy")
    tok = AutoTokenizer.from_pretrained(folder)
    tok.add_tokens([f"<extra_{i}>" for i in range(3000)])
    tok.save_pretrained(folder)
    assert len(tok) == 4230
    return folder


def test_a_tokenizer_larger_than_the_embedding_is_refused_with_both_numbers(grown_tokenizer):
    for call in (policy_ref, load_tokenizer):
        with pytest.raises(CheckpointError) as err:
            call(str(grown_tokenizer))
        msg = str(err.value)
        assert msg.startswith(f"{grown_tokenizer}: the tokenizer has 4230 tokens but the embedding has 1230 rows")
        assert "model.embed_tokens.weight in model.safetensors" in msg
    policy_ref(str(BASE))  # the shipped base itself is coherent


def test_eval_refuses_it_before_anything_is_written(grown_tokenizer, tmp_path):
    from hydra import compose, initialize_config_dir

    from eto_train import config
    from eto_train.stages import evaluate

    runs = tmp_path / "runs"
    with initialize_config_dir(config_dir=str(ROOT / "configs"), version_base="1.3"):
        cfg = config.load(compose("config", overrides=[f"paths.runs={runs}", f"eval.policy={grown_tokenizer}",
                                                       "runtime.rollout_threads=1"]))
    with pytest.raises(CheckpointError, match="the tokenizer has 4230 tokens but the embedding has 1230 rows"):
        evaluate.run(cfg)
    assert not runs.exists() or not any(p.is_file() for p in runs.rglob("*"))  # nothing written


def test_a_missing_chat_template_is_refused_unless_the_config_gives_one(tmp_path):
    import json

    folder = _copy_base(tmp_path / "policy")
    (folder / "chat_template.jinja").unlink()
    cfg = json.loads((folder / "tokenizer_config.json").read_text())
    cfg.pop("chat_template", None)
    (folder / "tokenizer_config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match=rf"^{folder}: the tokenizer has no chat template"):
        policy_ref(str(folder))
    with pytest.raises(CheckpointError, match="Set model.chat_template"):
        load_tokenizer(str(folder))
    template = (BASE / "chat_template.jinja").read_text()
    assert load_tokenizer(str(folder), chat_template=template).chat_template == template  # model.chat_template


def test_a_special_token_outside_the_embedding_is_named_with_its_id(tmp_path):
    from transformers import AutoTokenizer

    from eto_train.model.load import check_coherence

    tok = AutoTokenizer.from_pretrained(BASE)

    class Shifted:  # ids past the rows, with the token count itself within them (non-contiguous ids)
        def __len__(self):
            return len(tok)

        def __getattr__(self, name):
            return getattr(tok, name)

        eos_token_id = 5000

    with pytest.raises(CheckpointError) as err:
        check_coherence(BASE, Shifted())
    assert f"eos_token {tok.eos_token!r} = id 5000: outside the embedding's 1230 rows" in str(err.value)
    assert str(err.value).startswith(f"{BASE}: ")
