"""Real tokenizers and chat templates (Llama-2-chat, Llama-3.1, Mistral, Qwen2.5, Qwen3, Gemma-3)
on small random-init models of each family (tests/fixture_models.py): BC labels and DPO masks
token by token on a real two-turn episode, every end-of-turn id stops a rollout, the KV-cached
engine answers what HF generate answers on the whole conversation, and ETO export round-trips.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import yaml

from fixture_models import FAMILIES, build_fixture_model  # tests/fixture_models.py
from eto_train.config import BCSection
from eto_train.envs import make_env
from eto_train.eto_format import read_eto_file
from eto_train.export import export_training_data
from eto_train.model.load import load_model, load_tokenizer
from eto_train.records import PolicyRef, to_messages
from eto_train.rollouts.kvbatch import KVBatch
from eto_train.rollouts.loop import Policy, run_rollouts, stop_token_ids
from eto_train.store import write_jsonl
from eto_train.training.dpo import tokenize_pair
from eto_train.training.masks import assistant_token_mask
from eto_train.training.sft import conversation_dataset, make_trainer, sft_arguments
from fixture_settings import rollout_config, generation

ROOT_DIR = Path(__file__).resolve().parents[1]

# What each family's template makes of one assistant turn with content C: the tokens a model
# must generate to answer and stop (written by hand from each template).
TURN = {
    "llama2": "{} </s>",              # ' ' + content.strip() + ' ' + eos_token after '[/INST]'
    "llama3": "{}<|eot_id|>",
    "mistral": "{}</s>",              # the project's Mistral template (configs/model/mistral_7b_instruct.yaml)
    "qwen2_5": "{}<|im_end|>",
    "qwen3": "{}<|im_end|>",          # the last turn's empty <think></think> block is scaffolding, not trained
    "gemma3": "{}<end_of_turn>",
    "smollm2": "{}<|im_end|>",
}
STOPS = {  # tokenizer eos + generation_config.eos_token_id of each family's released checkpoints
    "llama2": ["</s>"], "mistral": ["</s>"],
    "llama3": ["<|end_of_text|>", "<|eom_id|>", "<|eot_id|>"],
    "qwen2_5": ["<|endoftext|>", "<|im_end|>"], "qwen3": ["<|endoftext|>", "<|im_end|>"],
    "gemma3": ["<eos>", "<end_of_turn>"],
    "smollm2": ["<|im_end|>"],
}
BC = {"max_length": 1024, "per_device_train_batch_size": 1, "gradient_accumulation_steps": 1, "learning_rate": 1e-3,
      "lr_scheduler_type": "constant", "warmup_steps": 0.0, "weight_decay": 0.0, "num_train_epochs": 1, "max_steps": 1, "logging_steps": 1,
      "save_strategy": "no", "save_total_limit": 1, "bf16": False, "activation_checkpointing": False,
      "use_cpu": True, "save_steps": 500, "only_success": True}


def chat_template(family: str) -> str | None:
    """The model config's own template override, as `model.chat_template` hands it to every stage."""
    cfg = yaml.safe_load((ROOT_DIR / "configs" / "model" / f"{FAMILIES[family].model_config}.yaml").read_text())
    return cfg.get("chat_template")


@pytest.fixture(scope="module")
def family_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("families")
    return {f: build_fixture_model(f, root / f) for f in FAMILIES}


def tokenizer(family_dirs, family):
    return load_tokenizer(str(family_dirs[family]), chat_template=chat_template(family))


@pytest.fixture(scope="module")
def two_turns(expert_episodes):
    """A real two-turn expert conversation (system, task, action, observation, action)."""
    ep = next(e for e in expert_episodes if len(e.steps) >= 2)
    return to_messages(ep, max_turns=2)


def runs(ids, mask):
    """The maximal runs of masked token ids."""
    out, cur = [], []
    for i, m in zip(ids, mask):
        if m:
            cur.append(i)
        elif cur:
            out.append(cur)
            cur = []
    return out + ([cur] if cur else [])


@pytest.mark.parametrize("family", list(FAMILIES))
def test_bc_labels_and_dpo_masks_are_the_assistant_turns_token_by_token(family_dirs, family, two_turns):
    tok = tokenizer(family_dirs, family)
    actions = [m["content"] for m in two_turns if m["role"] == "assistant"]
    expected = [TURN[family].format(a) for a in actions]
    # BC: the labels TRL's SFTTrainer builds from our pre-tokenized rows
    trainer = make_trainer(load_model(str(family_dirs[family])), tok, conversation_dataset([two_turns], tok),
                           sft_arguments(BCSection.model_validate(BC), "/tmp/unused", seed=0))
    batch = next(iter(trainer.get_train_dataloader()))
    ids, labels = batch["input_ids"][0].tolist(), batch["labels"][0].tolist()
    full = tok(tok.apply_chat_template(two_turns, tokenize=False), add_special_tokens=False)["input_ids"]
    assert ids == full  # one sequence, nothing added or cut
    labeled = [lab != -100 for lab in labels]
    assert [tok.decode(r) for r in runs(ids, labeled)] == expected
    assert all(lab in (-100, i) for i, lab in zip(ids, labels))
    # token by token: the unlabeled tokens are everything else, in order
    assert tok.decode([i for i, k in zip(ids, labeled) if not k]).count(actions[0]) == 0
    # DPO: the chosen and rejected completions' action masks (shared prompt = system + task)
    prompt, chosen = two_turns[:2], two_turns[2:]
    rejected = [{"role": "assistant", "content": "Action: look"}, chosen[1],
                {"role": "assistant", "content": "Action: inventory"}]
    row = tokenize_pair(tok, prompt, chosen, rejected)
    assert row["prompt_ids"] + row["chosen_ids"] == full
    assert [tok.decode(r) for r in runs(row["chosen_ids"], row["chosen_action_mask"])] == expected
    assert [tok.decode(r) for r in runs(row["rejected_ids"], row["rejected_action_mask"])] == \
        [TURN[family].format("Action: look"), TURN[family].format("Action: inventory")]


@pytest.mark.parametrize("family", list(FAMILIES))
def test_every_end_of_turn_id_stops_the_engine(family_dirs, family, monkeypatch):
    tok, model = tokenizer(family_dirs, family), load_model(str(family_dirs[family]))
    stops = stop_token_ids(tok, model.generation_config)
    assert stops == sorted(tok.convert_tokens_to_ids(STOPS[family]))
    answer = tok("Action: look", add_special_tokens=False)["input_ids"]
    conv = [{"role": "user", "content": "Task: look around\nObservation: a room"}]
    for stop in stops:
        script = iter(answer + [stop] + answer * 4)
        monkeypatch.setattr(KVBatch, "_pick", lambda self, logits: torch.tensor([next(script)]))
        session = KVBatch(model, tok, 12, 512, stop_ids=stops)
        session.add_row()
        ((text, _, n_new, _),) = session.step([conv])
        assert (text, n_new) == ("Action: look", len(answer) + 1), tok.convert_ids_to_tokens([stop])


@pytest.mark.parametrize("family", list(FAMILIES))
def test_kv_engine_keeps_its_cache_across_turns_of_a_real_template(family_dirs, family, monkeypatch):
    """Answers in the tokenizer's own split of the rendered turn: the next prompt extends the
    cached tokens, so no row is encoded anew (Qwen3's rewrite leaves rollout prompts prefixes)."""
    tok, model = tokenizer(family_dirs, family), load_model(str(family_dirs[family]))
    conv = [{"role": "system", "content": "Actions: look, go <dir>"},
            {"role": "user", "content": "Task: find the door\nObservation: a room"}]
    ids, mask = assistant_token_mask(tok, conv + [{"role": "assistant", "content": "Action: look"}])
    (turn,) = runs(ids, mask)  # e.g. Llama-2: '▁Action', ':', '▁look', '▁', '</s>'
    script = iter(turn * 3)
    monkeypatch.setattr(KVBatch, "_pick", lambda self, logits: torch.tensor([next(script)]))
    session = KVBatch(model, tok, 12, 2048, stop_ids=stop_token_ids(tok, model.generation_config))
    session.add_row()
    for k in range(3):
        ((text, n_prompt, n_new, _),) = session.step([conv])
        assert (text, n_new) == ("Action: look", len(turn))
        conv += [{"role": "assistant", "content": text}, {"role": "user", "content": f"Nothing happens ({k})."}]
    assert session.reencoded == 0


@pytest.mark.parametrize("family", list(FAMILIES))
def test_rollouts_equal_generate_on_the_whole_conversation_and_export_round_trips(
        family_dirs, family, twx_cfg, prompt, tmp_path):
    tok, model = tokenizer(family_dirs, family), load_model(str(family_dirs[family]))
    policy = Policy(model, tok, generation(max_new_tokens=8), max_context=2048)
    cfg = {**twx_cfg, "step_limit": 3}
    tasks = make_env(cfg).tasks("seen")[:3]
    ref = PolicyRef(id=f"{family}@fixture", path=str(family_dirs[family]), weights_sha256="")

    def play(p):
        eps = []
        run_rollouts([(t, 0) for t in tasks], lambda: make_env(cfg), p, ref, prompt,
                     rollout_config(batch_size=2), eps.append)
        return sorted(eps, key=lambda e: e.task_id)

    class WholeConversation:  # the same policy without a session: HF generate on every whole prompt
        def generate(self, convs):
            return policy.generate(convs)

    kv, whole = play(policy), play(WholeConversation())
    assert [[s.raw_output for s in e.steps] for e in kv] == [[s.raw_output for s in e.steps] for e in whole]
    assert sum(len(e.steps) for e in kv) >= len(tasks)
    # ETO export, then import: the same actions and observations, so the same trained tokens, plus
    # the "OK" that answers the instruction (the authors' layout has no system role: the system text
    # is the instruction turn, answered "OK", which their FastChat trainer trains on as well)
    store = tmp_path / "episodes.jsonl"
    write_jsonl(store, [e.to_dict() for e in kv])
    export_training_data([store], tmp_path / "eto.jsonl", {"format": "eto"})
    back = read_eto_file(tmp_path / "eto.jsonl")
    assert len(back) == len(kv)
    for a, b in zip(kv, back):
        assert [s.raw_output for s in a.steps] == [s.raw_output for s in b.steps]
        assert [s.observation for s in a.steps[:-1]] == [s.observation for s in b.steps[:-1]]  # the last is not trained
        ma, mb = (assistant_token_mask(tok, to_messages(e)) for e in (a, b))
        ok, *rest = [tok.decode(r) for r in runs(*mb)]
        assert ok.strip().startswith("OK") and rest == [tok.decode(r) for r in runs(*ma)]


def test_pad_equal_to_eos_keeps_every_end_of_turn_in_the_labels(family_dirs, two_turns):
    """SmolLM2's pad token is its eos <|im_end|>: a collator that masked the pad id in the labels would
    drop every <|im_end|> that closes an assistant turn, and the policy would never learn to stop.
    Two conversations of different lengths in one batch (so one row is padded with id 2): each
    assistant turn's <|im_end|> is labeled, the padding and every other <|im_end|> are not."""
    tok = tokenizer(family_dirs, "smollm2")
    end = tok.convert_tokens_to_ids("<|im_end|>")
    assert tok.pad_token_id == tok.eos_token_id == end
    short = two_turns[:3]  # system, task, first action
    args = sft_arguments(BCSection.model_validate({**BC, "per_device_train_batch_size": 2}), "/tmp/unused", seed=0)
    trainer = make_trainer(load_model(str(family_dirs["smollm2"])), tok, conversation_dataset([two_turns, short], tok),
                           args)
    batch = next(iter(trainer.get_train_dataloader()))
    padded = 0
    for ids, labels, attn in zip(batch["input_ids"].tolist(), batch["labels"].tolist(),
                                 batch["attention_mask"].tolist()):
        real = sum(attn)
        padded += len(ids) - real
        assert all(lab == -100 for lab in labels[real:])  # padding (id 2 too) is never a label
        closing = [j for j in range(real) if ids[j] == end and labels[j] != -100]
        assert len(closing) >= 1
        # every labeled <|im_end|> closes an assistant turn: the token before it is labeled too
        assert all(labels[j - 1] != -100 for j in closing)
        # and every assistant turn's <|im_end|> is labeled: as many as the row has assistant turns
        rendered = tok.decode(ids[:real])
        assert len(closing) == rendered.count("<|im_start|>assistant\n")
    assert padded > 0  # the batch was padded, with the pad id that is also the eos id
