"""The paper's full ScienceWorld run on GPUs, estimated (issue 55, item 4): an estimate, not a measurement.

What it sizes: the paper's profile (configs/paper/sciworld.yaml) on Llama-2-7B-Chat: BC on ETO's 1,483 training
variations (3 epochs), then 3 ETO iterations, each exploring the 1,483 (greedy), DPO on the pairs (3 epochs) and a
play of the 194 seen and 211 unseen variations; BC is played on both too. Full fine-tuning (FSDP2, bf16 compute over
fp32 masters), rollouts on vLLM.

What it stands on, each labelled in the printout:
- measured here: every task type's gold paths in tokens (docs/results/real_sciworld/lengths*.json, from
  lab/sciworld_lengths.py: steps, conversation tokens, tokens per exchange, the rollout prompt's fixed head); the
  authors' one-shot example (configs/prompt/sciworld_eto.yaml) in the Llama-2 and SmolLM2 tokenizers
  (tests/data/tokenizers): how many tokens a "Thought:" line adds to a turn, and Llama-2's tokens per SmolLM2 token;
- measured on a GPU (docs/lab/gpu_log.md, the H200 smoke test of 2026-12-04, a 1.06B model, 24 steps): 784 TFLOP/s
  of bf16 GEMM, FSDP2 full fine-tuning at 34.5% MFU, DPO at 31.2%, both taken as 7B's (a 7B model's larger
  matmuls usually run at a higher MFU: the hours are then an upper side);
- assumed, not measured anywhere: the demonstrations' thoughts are as long as the example's; a policy plays between
  its task's gold length or the limit if shorter (the low side) and its step limit (the high side); every training variation makes a pair
  (the high side: ties and wins are dropped); vLLM decodes 64 episodes at a time at half the rate the card's memory
  bandwidth (3.35 TB/s, H100 SXM) allows for reading the weights once per decode step, and prefills at the training
  MFU; the environments step between decode steps (their time adds to the wall clock, not to the GPU's), on the
  16 CPU cores of the lent GPU machines, each step as long as the median gold-path step measured here (loaded 2-core
  CPUs, the reset and the tokenizer included: an upper side).

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
GEMM_FLOPS = 784e12  # bf16 GEMM measured on the H200 smoke test (the H100 SXM has the same bf16 units)
MFU_SFT, MFU_DPO = 0.345, 0.312  # FSDP2 full fine-tuning and DPO, 1.06B, H200 (docs/lab/gpu_log.md)
HBM = 3.35e12  # bytes/s, H100 SXM (assumed: the slower card of the two the project is lent)
DECODE_ROWS, DECODE_EFFICIENCY = 64, 0.5  # assumed
CORES = 16  # CPU cores of the lent GPU machines (H100, H200), where the ScienceWorld JVMs run
EPOCHS_BC, EPOCHS_DPO, ITERATIONS = 3, 3, 3  # the paper's profile
EXTRA_TURNS = 5  # the rejected episode cut to the expert's length + 5 turns


@dataclass(frozen=True)
class TaskType:
    """One task type's numbers in Llama-2 tokens with thoughts (see :func:`task_types`)."""
    steps: float  # gold path length
    limit: int  # the paper's step limit
    demo: float  # the BC conversation (no example)
    head: float  # the rollout prompt before the first answer (opening, example, task)
    exchange: float  # one answer and its observation
    answer: float  # one answer (thought and action)


def estimate(types: dict[str, TaskType], splits: dict[str, list[str]], env_step: float = 0.0
             ) -> dict[str, tuple[float, float]]:
    """GPU-seconds per stage, (low, high): ``splits`` names each variation's task type (train, seen, unseen); and
    the environments' wall seconds on :data:`CORES` cores at ``env_step`` seconds a step (CPU, not GPU)."""
    per_token_train = 6 * N_PARAMS / (MFU_SFT * GEMM_FLOPS)  # seconds per token, forward and backward
    per_token_dpo = 8 * N_PARAMS / (MFU_DPO * GEMM_FLOPS)  # the policy's 6N and the reference's 2N (precomputed)
    per_token_prefill = 2 * N_PARAMS / (MFU_SFT * GEMM_FLOPS)
    per_token_decode = 2 * N_PARAMS / HBM / DECODE_ROWS / DECODE_EFFICIENCY  # bf16 weights read once a step

    def play(names: list[str], steps_of) -> float:
        total = 0.0
        for name in names:
            t = types[name]
            s = steps_of(t)
            total += (t.head + s * t.exchange) * per_token_prefill + s * t.answer * per_token_decode
        return total

    def env(names: list[str], steps_of) -> float:
        return sum(steps_of(types[n]) for n in names) * env_step / CORES

    out = {}
    train = splits["train"]
    out["BC (3 epochs)"] = (EPOCHS_BC * sum(types[n].demo for n in train) * per_token_train,) * 2
    tests = splits["seen"] + splits["unseen"]
    low, high = (lambda t: min(t.steps, t.limit)), (lambda t: t.limit)  # a play stops at the limit
    out["exploration (x3)"] = (ITERATIONS * play(train, low), ITERATIONS * play(train, high))
    pair = sum(2 * types[n].demo + EXTRA_TURNS * types[n].exchange for n in train)  # chosen + rejected (cut)
    out["DPO (x3, 3 epochs)"] = (ITERATIONS * EPOCHS_DPO * pair * per_token_dpo,) * 2
    out["seen + unseen plays (BC and 3 iterations)"] = ((1 + ITERATIONS) * play(tests, low),
                                                       (1 + ITERATIONS) * play(tests, high))
    out["GPU total"] = (sum(v[0] for v in out.values()), sum(v[1] for v in out.values()))
    plays = train * ITERATIONS + tests * (1 + ITERATIONS)
    out["environment steps (CPU wall clock, not GPU)"] = (env(plays, low), env(plays, high))
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
          f"{sum(demo) / 1e6:.2f}M in all.\n")
    print("| stage (estimate, not measured; H100-class GPU hours but the last row) | low | high |")
    print("| --- | --- | --- |")
    for stage, (low, high) in estimate(types, splits, env_step).items():
        print(f"| {stage} | {low / 3600:.1f} | {high / 3600:.1f} |")
    print(f"\nLow: policies play their tasks' gold lengths (or the limit, if shorter); high: their step limits. "
          f"Environment steps at {env_step:.2f} s each (the measured median), {CORES} at a time. Full fine-tuning of "
          "a 7B model needs at least two 80 GB GPUs (docs/gpu.md): on two, the GPU stages' wall clock is about half "
          "their GPU hours, the environments' is as printed.")


if __name__ == "__main__":
    main()
