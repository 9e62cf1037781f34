"""The paper's full ScienceWorld run on GPUs, estimated (issue 55, item 4): an estimate, not a measurement.

What it sizes: the paper's profile (configs/paper/sciworld.yaml) on Llama-2-7B-Chat: BC on ETO's 1,483 training
variations (3 epochs), then 3 ETO iterations, each exploring the 1,483 (greedy) and DPO on the pairs (3 epochs); BC
and the last iteration played on the 194 seen and 211 unseen variations (the profile selects nothing, so the loop
plays no other policy on them). Full fine-tuning (FSDP2, bf16 compute over fp32 masters; the DPO reference runs
beside the policy, `precompute_ref_log_probs: false`), rollouts on vLLM, every sequence within Llama-2's 4,096
tokens (`model.max_context`, `bc.max_length`, `eto.dpo.max_length`).

What it stands on, each labelled in the printout:
- measured here: every task type's gold paths in tokens (docs/results/real_sciworld/lengths*.json, from
  lab/sciworld_lengths.py: steps, conversation tokens, tokens per exchange, the rollout prompt's fixed head); the
  authors' one-shot example (configs/prompt/sciworld_eto.yaml) in the Llama-2 and SmolLM2 tokenizers
  (tests/data/tokenizers): how many tokens a "Thought:" line adds to a turn, and Llama-2's tokens per SmolLM2 token;
- measured on a GPU (docs/lab/gpu_log.md, the H200 smoke test of 2026-12-04, a 1.06B model in one process, 24
  steps): 790 TFLOP/s of bf16 GEMM (what its MFU is relative to), FSDP2 full fine-tuning at 34.5% MFU, DPO (its
  reference precomputed) at 31.2%: the low side uses them for the 7B model; the high side assumes 20% for both
  (several GPUs' traffic, activation checkpointing, the reference beside the policy);
- assumed, not measured anywhere: the demonstrations' thoughts are as long as the example's; a policy plays its
  task's gold length (the low side) or its step limit (the high side), stopped where its context is full; every
  training variation makes a pair (ties and wins are dropped in the run: fewer); vLLM decodes up to 64 episodes at
  a time, as many as the KV cache holds (80 GB less the bf16 weights, 85% of it), each decode step reading the
  weights once and every row's KV cache (Llama-2-7B has no grouped-query attention: 512 KiB a token) at half the
  card's memory bandwidth (3.35 TB/s, H100 SXM), and prefills at the training MFU; the environments step between
  decode steps (their time adds to the wall clock, not to the GPU's) on the 16 CPU cores of the lent GPU machines,
  each step as long as the median gold-path step measured here (loaded 2-core CPUs, the reset and the tokenizer
  included).

  .venv/bin/python lab/sciworld_gpu_estimate.py            # the table, H100-class GPU hours per stage

The arithmetic is in :func:`estimate` (checked by hand in tests/test_sciworld_gpu_estimate.py).
"""

from __future__ import annotations

import argparse
import json
import statistics
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
N_PARAMS = 6.74e9  # Llama-2-7B
WEIGHT_BYTES = 2 * N_PARAMS  # bf16
KV_BYTES = 2 * 32 * 4096 * 2  # per token: keys and values, 32 layers, 4,096 wide, bf16 (no grouped-query attention)
MAX_CONTEXT = 4096  # Llama-2's, bc.max_length and eto.dpo.max_length (paper_settings reads them)
GEMM_FLOPS = 790e12  # bf16 GEMM on the H200 smoke test, the MFUs' reference (the H100 SXM has the same units)
MFU_LOW_SIDE = (0.345, 0.312)  # (full fine-tuning, DPO) measured: FSDP2 and DPO, 1.06B, H200 (docs/lab/gpu_log.md)
MFU_HIGH_SIDE = (0.20, 0.20)  # assumed
HBM, GPU_MEMORY = 3.35e12, 80e9  # bytes/s and bytes, H100 SXM (the slower card of the two the project is lent)
KV_SHARE, DECODE_ROWS, DECODE_EFFICIENCY = 0.85, 64, 0.5  # assumed
CORES = 16  # CPU cores of the lent GPU machines (H100, H200), where the ScienceWorld JVMs run
# the paper's profile, read from configs/ by paper_settings() (these defaults are its values, for the tests)
EPOCHS_BC, EPOCHS_DPO, ITERATIONS, EXTRA_TURNS = 3, 3, 3, 5
TEST_PLAYS = 2  # no selection: the loop plays BC and the last policy on the tests


def paper_settings(experiment: str = "sciworld_llama2_7b") -> None:
    """The run's settings from its config (one home: configs/bc/paper.yaml, eto/paper.yaml, the model's)."""
    global EPOCHS_BC, EPOCHS_DPO, ITERATIONS, EXTRA_TURNS, MAX_CONTEXT
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(str(ROOT / "configs"), version_base="1.3", job_name="gpu_estimate"):
        c = compose("config", overrides=[f"experiment={experiment}"])
    assert c.eto.dev_split is None and not c.eto.early_stopping, "the estimate assumes no selection (TEST_PLAYS)"
    EPOCHS_BC, EPOCHS_DPO, ITERATIONS = c.bc.num_train_epochs, c.eto.dpo.num_train_epochs, c.eto.iterations
    EXTRA_TURNS = c.eto.pairs.extra_turns
    MAX_CONTEXT = min(c.model.max_context, c.bc.max_length, c.eto.dpo.max_length)


@dataclass(frozen=True)
class TaskType:
    """One task type's numbers in Llama-2 tokens with thoughts (see :func:`task_types`)."""
    steps: float  # gold path length
    limit: int  # the paper's step limit
    demo: float  # the BC conversation (no example)
    head: float  # the rollout prompt before the first answer (opening, example, task)
    exchange: float  # one answer and its observation
    answer: float  # one answer (thought and action)


def play_seconds(t: TaskType, steps: float, mfu: float) -> tuple[float, float]:
    """One episode of ``steps`` answers (fewer where the context fills): GPU seconds (prefill and decode), steps
    played. The context before answer k (0-based) is head + k exchanges; prefill reads each token once (vLLM's
    prefix cache), each decoded token costs its share of one weight read plus its own row's KV cache."""
    room = max(0.0, (MAX_CONTEXT - t.head - t.answer) // t.exchange + 1)
    s = min(steps, room)
    final = t.head + s * t.exchange
    rows = max(1.0, min(DECODE_ROWS, (KV_SHARE * GPU_MEMORY - WEIGHT_BYTES) // (final * KV_BYTES)))
    contexts = s * t.head + t.exchange * s * (s - 1) / 2  # the sum of the s contexts
    decode = (t.answer * s * WEIGHT_BYTES / rows + t.answer * contexts * KV_BYTES) / (HBM * DECODE_EFFICIENCY)
    return final * 2 * N_PARAMS / (mfu * GEMM_FLOPS) + decode, s


def estimate(types: dict[str, TaskType], splits: dict[str, list[str]], side: str, env_step: float = 0.0
             ) -> dict[str, float]:
    """Seconds per stage on one side (``low``: gold lengths, the measured MFUs; ``high``: step limits, 20%):
    GPU seconds, and the environments' wall seconds on :data:`CORES` cores at ``env_step`` seconds a step.
    ``splits`` names each variation's task type (train, seen, unseen)."""
    mfu_train, mfu_dpo = MFU_LOW_SIDE if side == "low" else MFU_HIGH_SIDE
    per_token_train = 6 * N_PARAMS / (mfu_train * GEMM_FLOPS)  # forward and backward
    per_token_dpo = 8 * N_PARAMS / (mfu_dpo * GEMM_FLOPS)  # the policy's 6N and the reference's forward 2N
    train, tests = splits["train"], splits["seen"] + splits["unseen"]

    def plays(names: list[str]) -> tuple[float, float]:
        got = [play_seconds(types[n], types[n].steps if side == "low" else types[n].limit, mfu_train) for n in names]
        return sum(g for g, _ in got), sum(s for _, s in got)
    explore, explore_steps = plays(train)
    test, test_steps = plays(tests)
    out = {"BC (3 epochs)": EPOCHS_BC * sum(min(types[n].demo, MAX_CONTEXT) for n in train) * per_token_train,
           "exploration (x3)": ITERATIONS * explore}
    pair = sum(min(types[n].demo, MAX_CONTEXT) + min(types[n].demo + EXTRA_TURNS * types[n].exchange, MAX_CONTEXT)
               for n in train)  # chosen, and rejected cut to the expert's length + 5 turns
    out["DPO (x3, 3 epochs)"] = ITERATIONS * EPOCHS_DPO * pair * per_token_dpo
    out["seen + unseen plays (BC, last iteration)"] = TEST_PLAYS * test
    out["GPU total"] = sum(out.values())
    out["environment steps (CPU wall clock, not GPU)"] = (ITERATIONS * explore_steps + TEST_PLAYS * test_steps
                                                          ) * env_step / CORES
    return out


def task_types(rows: list[dict], limits: dict[str, int], thought: float, answer: float, ratio: float
               ) -> dict[str, TaskType]:
    """Each measured task type's means, from SmolLM2 action-only tokens (``rows``) to Llama-2 tokens with
    thoughts: ``ratio`` Llama-2 tokens per SmolLM2 token, ``thought`` tokens added to each answer, ``answer``
    the Llama-2 tokens of an action-only answer."""
    out = {}
    for name in sorted({r["task"] for r in rows}):
        rs = [r for r in rows if r["task"] == name]

        def mean(key: str) -> float:
            return statistics.mean(r[key] for r in rs)
        steps = mean("steps")
        out[name] = TaskType(steps=steps, limit=limits[name], demo=ratio * mean("bc_tokens") + thought * steps,
                             head=ratio * mean("prefix_tokens"), exchange=ratio * mean("per_exchange") + thought,
                             answer=answer + thought)
    return out


def example_tokens() -> tuple[float, float, float]:
    """From the authors' example (configs/prompt/sciworld_eto.yaml): Llama-2 tokens a 'Thought:' line adds to an
    answer, Llama-2 tokens of an action-only answer, Llama-2 tokens per SmolLM2 token over the whole example."""
    import lzma

    from omegaconf import OmegaConf
    from tokenizers import Tokenizer

    def tokenizer(family: str) -> Tokenizer:
        xz = ROOT / "tests/data/tokenizers" / family / "tokenizer.json.xz"
        return Tokenizer.from_str(lzma.decompress(xz.read_bytes()).decode())
    llama, smol = tokenizer("llama2"), tokenizer("smollm2")
    example = OmegaConf.to_container(OmegaConf.load(ROOT / "configs/prompt/sciworld_eto.yaml").example)

    def n(tok: Tokenizer, text: str) -> int:
        return len(tok.encode(text, add_special_tokens=False).ids)
    answers = [m["content"] for m in example if m["role"] == "assistant"]
    actions = [a[a.index("Action:"):] for a in answers]
    thought = statistics.mean(n(llama, a) - n(llama, b) for a, b in zip(answers, actions))
    text = "\n".join(m["content"] for m in example)
    return thought, statistics.mean(n(llama, a) for a in actions), n(llama, text) / n(smol, text)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--lengths", nargs="*", default=[str(p) for p in sorted(
        (ROOT / "docs/results/real_sciworld").glob("lengths*.json"))])
    args = ap.parse_args()
    paper_settings()
    data = ROOT / "data/sciworld_eto"
    limits = json.loads((data / "max_steps.json").read_text())
    files = [json.loads(Path(p).read_text())["rows"] for p in args.lengths]
    rows = [r for f in files for r in f]
    env_step = statistics.median(r["seconds"] / r["steps"] for f in files for r in f[1:])  # f[0]: the JVM's start
    splits = {k: [t for t, _ in json.loads((data / f).read_text())]
              for k, f in (("train", "train_indices.json"), ("seen", "dev_indices.json"),
                           ("unseen", "test_indices.json"))}
    thought, answer, ratio = example_tokens()
    types = task_types(rows, limits, thought, answer, ratio)
    missing = sorted({t for v in splits.values() for t in v} - set(types))
    if missing:
        raise SystemExit(f"no gold-path lengths for {', '.join(missing)}: run lab/sciworld_lengths.py --tasks ...")
    print(f"From the example: a thought adds {thought:.1f} Llama-2 tokens to an answer (action alone "
          f"{answer:.1f}); {ratio:.3f} Llama-2 tokens per SmolLM2 token. Gold-path rows: {len(rows)}, "
          f"{len(types)} task types.")
    demo = [types[n].demo for n in splits["train"]]
    print(f"BC data: {len(demo)} conversations, mean {statistics.mean(demo):,.0f} Llama-2 tokens, "
          f"{sum(demo) / 1e6:.2f}M in all; {sum(d > MAX_CONTEXT for d in demo)} of them (by their type's mean) "
          f"past {MAX_CONTEXT}, cut there.\n")
    print("| stage (estimate, not measured; H100-class GPU hours but the last row) | low side | high side |")
    print("| --- | --- | --- |")
    low, high = estimate(types, splits, "low", env_step), estimate(types, splits, "high", env_step)
    for stage in low:
        print(f"| {stage} | {low[stage] / 3600:.1f} | {high[stage] / 3600:.1f} |")
    print(f"\nLow: policies play their tasks' gold lengths, training at the MFUs measured at 1B; high: their step "
          f"limits, 20% MFU; every sequence within {MAX_CONTEXT} tokens. "
          f"Environment steps at {env_step:.2f} s each (the measured median), {CORES} at a time. Full fine-tuning of "
          "a 7B model needs at least two 80 GB GPUs (docs/gpu.md): on two, the GPU stages' wall clock is about half "
          "their GPU hours, the environments' is as printed.")


if __name__ == "__main__":
    main()
