"""Are greedy episodes identical whatever the batch size and engine? (docs/gpu.md, determinism)

Plays the same TextWorldExpress episodes greedily with the batched KV engine
(rollouts/kvbatch.py) at several batch sizes and with plain HF ``generate`` (whole conversation
each turn), in one dtype, and prints how many turns and whole episodes agree with the KV engine
at batch 1. A turn agrees when it and every turn before it in its episode are identical (after the
first difference the episodes see different observations).

    .venv/bin/python lab/determinism.py --policy models/twx-base-1.7m --dtype bfloat16
    .venv/bin/python lab/determinism.py --family llama2 --dtype float32   # a random-init fixture
    ... --device cuda                                                          # on a GPU box
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def play(model, tok, env_cfg, work, batch: int, engine: str, max_new_tokens: int, max_context: int):
    from eto_train.config import shipped
    from eto_train.envs import make_env
    from eto_train.records import PolicyRef
    from eto_train.rollouts.loop import Policy, RolloutConfig, run_rollouts

    cfg = shipped()  # the CPU profiles' settings (configs/), the probe's own over them
    gen = cfg.rollout.generation.model_copy(update={"max_new_tokens": max_new_tokens})
    policy = Policy(model, tok, gen, max_context)
    if engine == "generate":
        policy.session = lambda: None  # the loop then answers whole conversations with HF generate
    eps = []
    run_rollouts(work, lambda: make_env(env_cfg), policy, PolicyRef(id="probe@0"), cfg.prompt.prompt_config(),
                 replace(RolloutConfig.of(cfg.rollout, 0), batch_size=batch), on_episode=eps.append)
    return {e.task_id: [s.raw_output for s in e.steps] for e in eps}


def agreement(ref: dict[str, list[str]], other: dict[str, list[str]]) -> dict[str, float]:
    turns = same = whole = 0
    for task, steps in ref.items():
        theirs = other[task]
        prefix = next((i for i, (a, b) in enumerate(zip(steps, theirs)) if a != b), min(len(steps), len(theirs)))
        turns, same, whole = turns + len(steps), same + prefix, whole + (steps == theirs)
    return {"turns": f"{same}/{turns}", "episodes": f"{whole}/{len(ref)}"}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--policy", default=str(ROOT / "models" / "twx-base-1.7m"))
    ap.add_argument("--family", help="a random-init fixture of this family (tests/fixture_models.py) instead of --policy")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--batches", default="1,4,32")
    ap.add_argument("--episodes", type=int, default=16, help="per game (mapreader, twc)")
    ap.add_argument("--max-new-tokens", type=int, default=20)  # rollout/cpu.yaml
    args = ap.parse_args()

    import torch
    from omegaconf import OmegaConf

    from eto_train.envs import make_env
    from eto_train.model.load import load_model, load_tokenizer

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    path = args.policy
    if args.family:
        import sys

        sys.path.insert(0, str(ROOT / "tests"))  # the fixtures' builder lives with its data (tests/data)
        from fixture_models import build_fixture_model

        path = str(build_fixture_model(args.family, Path(tempfile.mkdtemp()) / args.family))
    tok, model = load_tokenizer(path), load_model(path, dtype=args.dtype, device=args.device)
    env_cfg = OmegaConf.to_container(OmegaConf.load(ROOT / "configs" / "env" / "twx.yaml"))
    env_cfg["splits"] = {"seen": {"fold": "train", "start": 800, "count": args.episodes}}
    lister = make_env(env_cfg)
    work = [(t, 0) for t in lister.tasks("seen")]
    lister.close()
    max_context = min(1024, getattr(model.config, "max_position_embeddings", 1024))
    runs = {}
    for b in [int(x) for x in args.batches.split(",")]:
        runs[f"kv@{b}"] = play(model, tok, env_cfg, work, b, "kv", args.max_new_tokens, max_context)
    runs["generate@1"] = play(model, tok, env_cfg, work, 1, "generate", args.max_new_tokens, max_context)
    runs["generate@32"] = play(model, tok, env_cfg, work, 32, "generate", args.max_new_tokens, max_context)
    ref = runs["kv@1"]
    table = {name: agreement(ref, r) for name, r in runs.items() if name != "kv@1"}
    print(json.dumps({"policy": args.family or path, "dtype": args.dtype, "device": args.device,
                      "against": "kv@1", **table}))


if __name__ == "__main__":
    main()
