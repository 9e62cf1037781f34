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

from .. import tracking
from ..manifest import Stage
from ..runtime import setup_runtime, to_plain
from ..store import write_json
from ..validate import check_config

TWX_CONFIG = Path(__file__).resolve().parents[3] / "configs" / "env" / "twx.yaml"
# what each step writes in its folder (a rerun of a finished step with another config works aside
# and replaces exactly these when it finishes, see eto_train.manifest.Stage)
OUTPUTS = ["model", "checkpoints", "probes.json", "progress.json"]
TOKEN_OUTPUTS = ["tokenizer", "train.bin", "heldout.bin"]


def check(cfg) -> None:
    """Every bad ``pretrain.*`` value at once (one ValueError, a line per key), before anything runs;
    the rest of the config is :func:`eto_train.validate.check_config`'s."""
    from ..pretrain.transcripts import KINDS, GenConfig, settings_of

    check_config(cfg)
    pc, errors = to_plain(cfg.pretrain), []

    def positive(key: str, value, integer: bool = True, null: bool = False) -> None:
        ok = (value is None and null) or (isinstance(value, (int, float)) and not isinstance(value, bool)
                                          and value > 0 and (not integer or float(value).is_integer()))
        if not ok:
            errors.append(f"pretrain.{key}={value!r}: expected a {'whole ' if integer else ''}number > 0"
                          + (" or null" if null else ""))

    data, train, arch = pc["data"], pc["train"], pc["arch"]
    try:
        settings_of(data["settings"], data.get("only_games"))
    except ValueError as exc:
        errors.append(str(exc))
    try:
        seed_sets(cfg)
    except (ValueError, KeyError) as exc:
        errors.append(str(exc))
    for part in ("kinds", "heldout_kinds"):
        kinds = data.get(part) or {}
        if set(kinds) - set(KINDS) or any(not isinstance(n, int) or n < 0 for n in kinds.values()) \
                or not any(kinds.values()):
            errors.append(f"pretrain.data.{part}={kinds!r}: expected counts >= 0 of {list(KINDS)}, not all 0")
    unknown = set(data.get("play") or {}) - set(GenConfig.__dataclass_fields__)
    if unknown:
        errors.append(f"pretrain.data.play: unknown keys {sorted(unknown)} (of {sorted(GenConfig.__dataclass_fields__)})")
    positive("data.shard_tasks", data.get("shard_tasks"))
    positive("data.workers", data.get("workers"), null=True)
    positive("data.max_tasks_per_setting", data.get("max_tasks_per_setting"), null=True)
    positive("tokenizer.vocab_size", pc["tokenizer"].get("vocab_size"))
    for key in ("hidden_size", "num_layers", "num_heads", "intermediate_size", "max_position_embeddings"):
        positive(f"arch.{key}", arch.get(key))
    if all(isinstance(arch.get(k), int) and arch[k] > 0 for k in ("hidden_size", "num_heads")) \
            and arch["hidden_size"] % arch["num_heads"]:
        errors.append(f"pretrain.arch.hidden_size={arch['hidden_size']}: not a multiple of "
                      f"pretrain.arch.num_heads={arch['num_heads']}")
    for key in ("seq_len", "batch_size", "grad_accum", "save_steps", "logging_steps"):
        positive(f"train.{key}", train.get(key))
    positive("train.lr", train.get("lr"), integer=False)
    positive("train.max_steps", train.get("max_steps"), null=True)
    if isinstance(train.get("seq_len"), int) and isinstance(arch.get("max_position_embeddings"), int) \
            and train["seq_len"] > arch["max_position_embeddings"]:
        errors.append(f"pretrain.train.seq_len={train['seq_len']}: exceeds pretrain.arch.max_position_embeddings="
                      f"{arch['max_position_embeddings']}")
    if errors:
        n = len(errors)
        raise ValueError(f"{n} bad config value{'s' if n > 1 else ''} (nothing was run or written):\n  "
                         + "\n  ".join(errors))


def exclusion_env(cfg) -> dict[str, Any]:
    """The env config whose splits pretraining must avoid: the run's env when it is
    TextWorldExpress, else the repository's ``configs/env/twx.yaml``."""
    env = to_plain(cfg.env)
    if env.get("name") == "twx":
        return env
    from omegaconf import OmegaConf

    return OmegaConf.to_container(OmegaConf.load(TWX_CONFIG), resolve=True)


def seed_sets(cfg):
    from ..pretrain.transcripts import pretrain_seeds

    data = to_plain(cfg.pretrain.data)
    return pretrain_seeds(exclusion_env(cfg)["splits"], data["heldout"], data["folds"])


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
    stage = Stage("pretrain/tokens", out / "tokens", {"tokenizer": tok_cfg},
                  inputs={"data": data_dir / "manifest.json"}, outputs=TOKEN_OUTPUTS)
    if not stage.done():
        train_shards, held_shards = shard_files(data_dir, "train"), shard_files(data_dir, "heldout")
        if not train_shards:
            raise FileNotFoundError(f"pretrain/tokens: no training shards in {data_dir} (train-*.jsonl)")
        stage.begin()
        work = Path(getattr(stage, "work", stage.dir))
        tok = train_tokenizer(sample_texts(train_shards, tok_cfg.get("sample_transcripts")),
                              vocab_size=tok_cfg["vocab_size"], min_frequency=tok_cfg["min_frequency"])
        tok.save_pretrained(work / "tokenizer")
        n_train = write_tokens(train_shards, tok, work / "train.bin")
        n_held = write_tokens(held_shards, tok, work / "heldout.bin")
        stage.finish({"train_tokens": n_train, "heldout_tokens": n_held, "vocab_size": len(tok)})
        console.print(f"[pretrain/tokens] vocabulary {len(tok)}, {n_train:,} training and {n_held:,} held-out tokens")
    return json.loads(stage.manifest_path.read_text())


def run(cfg, command: str | None = None) -> None:
    from .. import killpoints
    from ..model.tiny import build_tiny_model
    from ..pretrain.card import plot_loss, write_card
    from ..pretrain.probes import build_probes, probes_to_rows
    from ..pretrain.tokens import PackedBlocks
    from ..pretrain.train import PROBE, make_callbacks, steps_of, training_args
    from ..pretrain.transcripts import read_transcripts, render, shard_files
    from ..training.resume import resume_checkpoint

    check(cfg)
    console = Console(markup=False)
    setup_runtime(cfg.runtime.train_threads)
    pc = to_plain(cfg.pretrain)
    out = Path(pc["out"])
    t_start = time.time()

    data_manifest = make_data(cfg, console)
    tokens_manifest = make_tokens(cfg, out, console)

    stage = Stage("pretrain", out, {"arch": pc["arch"], "train": pc["train"], "probes": pc["probes"],
                                    "seed": cfg.seed}, inputs={"tokens": out / "tokens" / "manifest.json"},
                  outputs=OUTPUTS)
    if stage.done():
        return

    # -- check, then touch: tokenizer, model, packed blocks and probes before anything is written --
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(out / "tokens" / "tokenizer"))
    arch, train, probe_cfg = pc["arch"], pc["train"], pc["probes"]
    seq_len = int(train["seq_len"])
    model = build_tiny_model(tokenizer, seed=cfg.seed, **arch)
    n_params = sum(p.numel() for p in model.parameters())
    vocab = len(tokenizer)
    blocks = PackedBlocks(out / "tokens" / "train.bin", vocab, seq_len)
    if len(blocks) == 0:
        raise ValueError(f"pretrain: {tokens_manifest['metrics']['train_tokens']} training tokens make no block of "
                         f"pretrain.train.seq_len={seq_len} tokens; generate more data or shorten the blocks")
    heldout = PackedBlocks(out / "tokens" / "heldout.bin", vocab, seq_len)
    held = list(read_transcripts(shard_files(cfg.pretrain.data.dir, "heldout")))
    probes = build_probes(held, lambda msgs: render(tokenizer, msgs), probe_cfg.get("room_games", ["mapreader"]),
                          probe_cfg.get("object_games", ["twc"]), probe_cfg.get("max_per_probe"))
    tokens_per_step = int(train["batch_size"]) * int(train.get("grad_accum", 1)) * seq_len
    steps = steps_of(len(blocks), train)

    resume = stage.begin()  # the first write
    work = Path(getattr(stage, "work", stage.dir))  # <out>, or <out>/.next when a finished base is replaced
    console.print(f"[pretrain] Llama {n_params / 1e6:.2f}M parameters, vocabulary {vocab}; {len(blocks):,} blocks of "
                  f"{seq_len} tokens; {steps:,} steps x {tokens_per_step:,} tokens; {len(probes)} probes")

    from transformers import Trainer, default_data_collator
    from transformers.trainer_callback import PrinterCallback, ProgressCallback

    args = training_args(str(work / "checkpoints"), train, cfg.seed, tracking.report_to())
    trainer = Trainer(model=model, args=args, train_dataset=blocks, data_collator=default_data_collator)
    for default in (PrinterCallback, ProgressCallback):  # one progress line per log step instead (make_callbacks)
        trainer.remove_callback(default)
    trainer.add_callback(make_callbacks(tokenizer=tokenizer, probes=probes, heldout=heldout, probe_cfg=probe_cfg,
                                        max_context=seq_len, tokens_per_step=tokens_per_step,
                                        progress_path=work / "progress.json", console=console))
    if (kill := killpoints.trainer_callback("pretrain")) is not None:  # tests only
        trainer.add_callback(kill)

    # -- train (resumes from the last complete checkpoint of an interrupted run) -----------------
    ckpt = resume_checkpoint(work / "checkpoints", resume)
    if ckpt:
        console.print(f"[pretrain] resuming from the last checkpoint {ckpt} (optimizer, scheduler, RNG)")
    t_train = time.time()
    result = trainer.train(resume_from_checkpoint=ckpt)
    train_seconds = time.time() - t_train

    # -- save the base, its card, loss curve and probes -----------------------------------------
    model_dir = work / "model"
    trainer.model.save_pretrained(model_dir, safe_serialization=True)
    tokenizer.save_pretrained(model_dir)
    history = trainer.state.log_history
    plot_loss(history, model_dir / "loss.png")
    probe_rows = [e for e in history if f"{PROBE}seconds" in e]
    write_json(work / "probes.json", {"history": probe_rows, "probes": probes_to_rows(probes)})
    losses = [e["loss"] for e in history if "loss" in e]
    done_steps = result.global_step - (int(Path(ckpt).name.split("-")[1]) if ckpt else 0)
    first = int(Path(ckpt).name.split("-")[1]) if ckpt else -1
    probe_seconds = sum(e[f"{PROBE}seconds"] for e in probe_rows if e["step"] > first)  # this session's
    tps = done_steps * tokens_per_step / max(1e-9, train_seconds - probe_seconds) if done_steps else 0.0
    data_summary = data_manifest["summary"]
    info = {
        "name": Path(out).parent.name + "/pretrain", "command": command or "eto-train pretrain",
        "parameters": n_params, "arch": arch, "vocab_size": vocab, "seq_len": seq_len, "data": data_summary,
        "settings": data_manifest["settings"], "seeds": data_manifest["config"]["seeds"],
        "tokens": {"train": tokens_manifest["metrics"]["train_tokens"], "heldout": tokens_manifest["metrics"]["heldout_tokens"]},
        "train": train, "steps": result.global_step, "tokens_seen": result.global_step * tokens_per_step,
        "seconds": {"data": data_manifest["seconds"], "tokens": tokens_manifest["seconds"], "train": train_seconds,
                    "probes": probe_seconds, "total": time.time() - t_start},
        "tokens_per_second": tps, "final_loss": losses[-1] if losses else None, "log_history": history,
        "threads": _threads(), "resumed_from": Path(ckpt).name if ckpt else None, "loss_png": "loss.png",
        "model_dir": str(out / "model"),
        "sha256": {name: _sha256sum(model_dir / name) for name in ("model.safetensors", "tokenizer.json")},
    }
    write_card(model_dir / "MODEL_CARD.md", info)
    last = probe_rows[-1] if probe_rows else {}
    metrics = {"parameters": n_params, "vocab_size": vocab, "optimizer_steps": result.global_step,
               "tokens_seen": result.global_step * tokens_per_step, "train_tokens": info["tokens"]["train"],
               "final_train_loss": info["final_loss"], "mean_train_loss": result.training_loss,
               "train_seconds": round(train_seconds, 2), "probe_seconds": round(probe_seconds, 2),
               "tokens_per_second": round(tps, 1),
               "probes": probe_rows, "final_probes": last}
    if ckpt:
        metrics["resumed_from"] = Path(ckpt).name
    stage.finish(metrics, output=str(out / "model"), command=info["command"])
    console.print(f"[pretrain] {result.global_step} steps, final loss {info['final_loss'] if losses else float('nan'):.4f}, "
                  f"{tps:,.0f} tokens/s -> {out / 'model'} (MODEL_CARD.md)")


def _sha256sum(path: Path) -> str:
    """What ``sha256sum`` prints for the file (store.file_sha256 also hashes the name)."""
    import hashlib

    return hashlib.sha256(path.read_bytes()).hexdigest()


def _threads() -> int:
    import torch

    return torch.get_num_threads()
