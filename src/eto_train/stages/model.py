"""Stage `model`: build the offline tiny base model from the expert trajectories' text.

Nothing is downloaded: a BPE tokenizer is trained on the rendered expert conversations, a small
Llama config is initialised from the seed, and both are saved with save_pretrained.
"""

from __future__ import annotations

from rich.console import Console

from ..config import typed
from ..experts import read_experts
from ..manifest import Stage
from ..model.tiny import build_tiny_model, save, train_tokenizer
from ..records import to_messages
from ..runtime import setup_runtime


def run(cfg) -> None:
    cfg = typed(cfg)
    console = Console(markup=False)
    if not cfg.model.build:
        console.print(f"[model] model.build=false: using {cfg.model.path} as it is")
        return
    setup_runtime(cfg.runtime.train_threads)
    stage = Stage("model", cfg.model.path, {"model": cfg.model.plain(), "seed": cfg.seed},
                  inputs={"experts": cfg.paths.experts})
    if stage.done():
        return
    texts = [m["content"] for ep in read_experts(cfg.paths.experts) for m in to_messages(ep)]
    tok = train_tokenizer(texts, **cfg.model.tokenizer.plain())
    model = build_tiny_model(tok, seed=cfg.seed, **cfg.model.arch.plain())
    save(model, tok, cfg.model.path)
    n_params = sum(p.numel() for p in model.parameters())
    stage.finish({"parameters": n_params, "vocab_size": len(tok)})
    console.print(f"[model] tiny Llama with {n_params / 1e6:.2f}M parameters, vocabulary {len(tok)} "
                  f"-> {cfg.model.path}")
