"""Stage `pretrain`: a small causal LM pretrained on text-game transcripts (``make pretrain``).

Three steps, each with its own manifest (skipped when its config and inputs are unchanged):

1. ``pretrain/data`` (``pretrain.data.dir``): transcripts of every configured TextWorldExpress
   setting, on seeds no env split uses (:mod:`eto_train.pretrain.transcripts`), in JSONL shards;
   a killed run keeps its finished shards. Several runs can share one data folder.
2. ``pretrain/tokens`` (``<out>/tokens``): the BPE tokenizer trained on the transcripts and the
   token streams of the training and held-out transcripts.
3. ``pretrain`` (``<out>``): a Llama of ``pretrain.arch`` trained with the HF Trainer on packed
   blocks, loss on every token; checkpoints in ``<out>/checkpoints`` (a killed run resumes from
   the last complete one), held-out loss and reading probes every ``pretrain.probes.every``
   steps, ``progress.json`` while it runs. The base goes to ``<out>/model``: safetensors,
   tokenizer (ChatML template), ``MODEL_CARD.md`` and ``loss.png``; ``probes.json`` beside it.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from rich.console import Console

from .. import layout, tracking
from ..config import Config, require
from ..distributed import is_main
from ..manifest import Stage
from ..runtime import setup_runtime, to_plain
from ..store import write_json

# what each step writes in its folder (a rerun of a finished step with another config works aside
# and replaces exactly these when it finishes, see eto_train.manifest.Stage)
OUTPUTS = [layout.POLICY, layout.CHECKPOINTS, layout.PROBES, layout.PROGRESS]
TOKEN_OUTPUTS = [layout.TOKENIZER, layout.TRAIN_TOKENS, layout.HELDOUT_TOKENS]


def seed_sets(cfg):
    """Pretraining's positions and held-out ones, clear of every TextWorldExpress split a run plays."""
    from ..pretrain.positions import avoided_splits, pretrain_seeds

    data = to_plain(cfg.pretrain.data)
    splits = avoided_splits(to_plain(cfg.env))
    if splits is None:
        raise FileNotFoundError("configs/env/twx.yaml: pretraining avoids its splits; the file is not there")
    return pretrain_seeds(splits, data["heldout"], data["folds"])


def _data_config(cfg) -> dict[str, Any]:
    """What the transcripts depend on (not where they go, nor how many processes play them)."""
    from ..pretrain.transcripts import GENERATOR_VERSION

    data = {k: v for k, v in to_plain(cfg.pretrain.data).items() if k not in ("dir", "workers")}
    return {"data": data, "prompt": to_plain(cfg.prompt), "seed": cfg.seed,
            "seeds": seed_sets(cfg).summary(), "generator": GENERATOR_VERSION}


def make_data(cfg, console) -> dict[str, Any]:
    """Step 1: the transcript shards (or the finished ones already there); the data manifest."""
    from ..pretrain.transcripts import GenConfig, generate, settings_of

    data = to_plain(cfg.pretrain.data)
    stage = Stage("pretrain/data", data["dir"], _data_config(cfg))
    if not stage.done():
        resume = stage.begin()
        settings = settings_of(data["settings"], data.get("only_games"))
        summary = generate(data["dir"], settings, seed_sets(cfg), data["kinds"], GenConfig(**data["play"]),
                           to_plain(cfg.prompt), cfg.seed, data["shard_tasks"],
                           heldout_kinds=data.get("heldout_kinds"), max_tasks=data.get("max_tasks_per_setting"),
                           workers=int(data.get("workers") or 1), resume=resume, console=console)
        stage.finish({"train_transcripts": summary["train"]["transcripts"],
                      "heldout_transcripts": summary["heldout"]["transcripts"]},
                     summary=summary, settings=[asdict(s) for s in settings])
        console.print(f"[pretrain/data] {summary['train']['transcripts']:,} training and "
                      f"{summary['heldout']['transcripts']:,} held-out transcripts -> {data['dir']}")
    return json.loads(stage.manifest_path.read_text())


def make_tokens(cfg, out: Path, console) -> dict[str, Any]:
    """Step 2: the tokenizer and the token files; the tokens manifest."""
    from ..model.tiny import train_tokenizer
    from ..pretrain.tokens import sample_texts, write_tokens
    from ..pretrain.transcripts import shard_files

    data_dir, tok_cfg = Path(cfg.pretrain.data.dir), to_plain(cfg.pretrain.tokenizer)
    stage = Stage("pretrain/tokens", out / layout.TOKENS, {"tokenizer": tok_cfg},
                  inputs={"data": layout.manifest(data_dir)}, outputs=TOKEN_OUTPUTS)
    if not stage.done():
        train_shards, held_shards = shard_files(data_dir, "train"), shard_files(data_dir, "heldout")
        if not train_shards:
            raise FileNotFoundError(f"pretrain/tokens: no training shards in {data_dir} (train-*.jsonl)")
        stage.begin()
        work = Path(getattr(stage, "work", stage.dir))
        tok = train_tokenizer(sample_texts(train_shards, tok_cfg.get("sample_transcripts")),
                              vocab_size=tok_cfg["vocab_size"], min_frequency=tok_cfg["min_frequency"])
        tok.save_pretrained(work / layout.TOKENIZER)
        n_train = write_tokens(train_shards, tok, work / layout.TRAIN_TOKENS)
        n_held = write_tokens(held_shards, tok, work / layout.HELDOUT_TOKENS)
        stage.finish({"train_tokens": n_train, "heldout_tokens": n_held, "vocab_size": len(tok)})
        console.print(f"[pretrain/tokens] vocabulary {len(tok)}, {n_train:,} training and {n_held:,} held-out tokens")
    return json.loads(stage.manifest_path.read_text())


def run(cfg: Config, command: str | None = None) -> None:
    require(cfg, "eto_train.stages.pretrain.run")  # pretrain.* and the held-out seeds: checked by config.load
    from ..model.tiny import build_tiny_model
    from ..pretrain.card import plot_loss, write_card
    from ..pretrain.probes import build_probes, probes_to_rows
    from ..pretrain.tokens import PackedBlocks
    from ..pretrain.train import PROBE, PretrainJob, make_callbacks, steps_of, training_args
    from ..pretrain.transcripts import read_transcripts, render, shard_files
    from ..runtime import _threads
    from ..training import recipe

    console = Console(markup=False)
    setup_runtime(cfg.runtime.train_threads)
    pc = to_plain(cfg.pretrain)
    out = Path(pc["out"])
    arch, train, probe_cfg = pc["arch"], pc["train"], pc["probes"]
    seq_len = int(train["seq_len"])
    tokens_per_step = cfg.pretrain.train.batch_size * cfg.pretrain.train.grad_accum * seq_len
    command = command or "eto-train pretrain"
    t_start = time.time()

    data_manifest = make_data(cfg, console)
    tokens_manifest = make_tokens(cfg, out, console)

    stage = Stage("pretrain", out, {"arch": arch, "train": train, "probes": probe_cfg, "seed": cfg.seed},
                  inputs={"tokens": layout.manifest(out / layout.TOKENS)}, outputs=OUTPUTS)
    if stage.done():
        return

    with recipe.held(stage):  # cleanup: the stage's lock is released whatever happens
        # -- setup: tokenizer, model, packed blocks and probes made and checked before anything is written
        from transformers import AutoTokenizer

        tokens = out / layout.TOKENS
        tokenizer = AutoTokenizer.from_pretrained(str(tokens / layout.TOKENIZER))
        model = build_tiny_model(tokenizer, seed=cfg.seed, **arch)
        vocab = len(tokenizer)
        blocks = PackedBlocks(tokens / layout.TRAIN_TOKENS, vocab, seq_len)
        if len(blocks) == 0:
            raise ValueError(f"pretrain: {tokens_manifest['metrics']['train_tokens']} training tokens make no block "
                             f"of pretrain.train.seq_len={seq_len} tokens; generate more data or shorten the blocks")
        heldout = PackedBlocks(tokens / layout.HELDOUT_TOKENS, vocab, seq_len)
        held = list(read_transcripts(shard_files(cfg.pretrain.data.dir, "heldout")))
        pr = cfg.pretrain.probes
        probes = build_probes(held, lambda msgs: render(tokenizer, msgs), pr.room_games, pr.object_games,
                              pr.max_per_probe)
        parameters = sum(p.numel() for p in model.parameters())
        console.print(f"[pretrain] Llama {parameters / 1e6:.2f}M parameters, vocabulary {vocab}; "
                      f"{len(blocks):,} blocks of {seq_len} tokens; {steps_of(len(blocks), train):,} steps x "
                      f"{tokens_per_step:,} tokens; {len(probes)} probes")
        callbacks = make_callbacks(tokenizer=tokenizer, probes=probes, heldout=heldout, probe_cfg=probe_cfg,
                                   max_context=seq_len, tokens_per_step=tokens_per_step,
                                   progress_path=Path(stage.work) / layout.PROGRESS, console=console)
        args = training_args(str(layout.checkpoints(stage.work)), train, cfg.seed, tracking.report_to())
        job = PretrainJob("pretrain", str(tokens / layout.TOKENIZER), blocks, args, {"dtype": "float32"},
                          built_tokenizer=tokenizer, built_model=model, callbacks=[callbacks])
        # -- train and save: a killed run resumes from its last checkpoint
        trained = recipe.train(job, stage.work, begin=stage.begin, console=console)
        # -- the base's card, loss curve and probes beside it (before the manifest commits them), then the manifest
        result, ckpt = trained.result, trained.resumed_from
        model_dir, history = layout.policy(Path(stage.work)), trained.trainer.state.log_history
        probe_rows = [e for e in history if f"{PROBE}seconds" in e]
        losses = [e["loss"] for e in history if "loss" in e]
        resumed_at = int(Path(ckpt).name.split("-")[1]) if ckpt else None
        done_steps = result.global_step - (resumed_at or 0)  # this session's
        probe_seconds = sum(e[f"{PROBE}seconds"] for e in probe_rows if e["step"] > (resumed_at if ckpt else -1))
        train_seconds = result.metrics["train_runtime"]
        tps = done_steps * tokens_per_step / max(1e-9, train_seconds - probe_seconds) if done_steps else 0.0
        if is_main():
            plot_loss(history, model_dir / layout.LOSS_PLOT)
            write_json(Path(stage.work) / layout.PROBES, {"history": probe_rows, "probes": probes_to_rows(probes)})
            write_card(model_dir / layout.MODEL_CARD, {
                "name": Path(out).parent.name + "/pretrain", "command": command, "parameters": parameters,
                "arch": arch, "vocab_size": vocab, "seq_len": seq_len, "data": data_manifest["summary"],
                "settings": data_manifest["settings"], "seeds": data_manifest["config"]["seeds"],
                "tokens": {"train": tokens_manifest["metrics"]["train_tokens"],
                           "heldout": tokens_manifest["metrics"]["heldout_tokens"]},
                "train": train, "steps": result.global_step, "tokens_seen": result.global_step * tokens_per_step,
                "seconds": {"data": data_manifest["seconds"], "tokens": tokens_manifest["seconds"],
                            "train": train_seconds, "probes": probe_seconds, "total": time.time() - t_start},
                "tokens_per_second": tps, "final_loss": losses[-1] if losses else None, "log_history": history,
                "threads": _threads(), "resumed_from": Path(ckpt).name if ckpt else None,
                "loss_png": layout.LOSS_PLOT, "model_dir": str(layout.policy(out)),
                "sha256": {name: _sha256sum(model_dir / name) for name in ("model.safetensors", "tokenizer.json")}})
        m = recipe.finish(stage, trained, {
            "parameters": parameters, "vocab_size": vocab, "optimizer_steps": result.global_step,
            "tokens_seen": result.global_step * tokens_per_step, "train_tokens": tokens_manifest["metrics"]["train_tokens"],
            "final_train_loss": losses[-1] if losses else None, "mean_train_loss": result.training_loss,
            "train_seconds": round(train_seconds, 2), "probe_seconds": round(probe_seconds, 2),
            "tokens_per_second": round(tps, 1), "probes": probe_rows, "final_probes": probe_rows[-1] if probe_rows else {}},
            command=command)
    if not m:
        return
    loss = m["final_train_loss"]
    console.print(f"[pretrain] {m['optimizer_steps']} steps, final loss {loss if loss is not None else float('nan'):.4f}, "
                  f"{m['tokens_per_second']:,.0f} tokens/s -> {layout.policy(out)} (MODEL_CARD.md)")


def _sha256sum(path: Path) -> str:
    """What ``sha256sum`` prints for the file (store.file_sha256 also hashes the name)."""
    import hashlib

    return hashlib.sha256(path.read_bytes()).hexdigest()
