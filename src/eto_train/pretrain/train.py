"""Next-token pretraining with the HF Trainer: packed blocks, loss on every token, probes.

:class:`PretrainJob` is the training recipe's job for it (:mod:`eto_train.training.recipe`: resume,
finite guard, kill points and the checked save are the recipe's, as for bc and dpo).

Checkpoints (weights, optimizer, scheduler, RNG, ``trainer_state.json`` with the log history)
every ``save_steps``; an interrupted run resumes from the last complete one
(:func:`eto_train.training.resume.resume_checkpoint`) and ends with the same weights as an
uninterrupted run. Every ``probes.every`` optimizer steps (and before the first), the model's
held-out loss and the reading probes (:mod:`.probes`) are measured and appended to the
Trainer's log history as ``probe/...`` entries, so they travel with the checkpoints: a resumed
run keeps the measurements up to its checkpoint and redoes the later ones. ``progress.json`` in
the stage folder is rewritten at every measurement and log line (step, tokens, loss, probes,
tokens/s, time left).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..store import write_json
from ..training.recipe import Job
from .probes import LMScorer, Probe, run_probes

PROBE = "probe/"


def flatten(prefix: str, d: dict[str, Any]) -> dict[str, Any]:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(flatten(f"{prefix}{k}/", v))
        else:
            out[f"{prefix}{k}"] = v
    return out


def heldout_loss(model, blocks, n_blocks: int, batch: int = 8) -> float | None:
    """Mean next-token loss over the first ``n_blocks`` held-out blocks."""
    import torch

    n = min(len(blocks), int(n_blocks))
    if n == 0:
        return None
    was_training = model.training
    model.eval()
    total = 0.0
    try:
        with torch.no_grad():
            for start in range(0, n, batch):
                ids = torch.stack([blocks[i]["input_ids"] for i in range(start, min(n, start + batch))])
                total += float(model(input_ids=ids, labels=ids).loss) * len(ids)
    finally:
        model.train(was_training)
    return total / n


def measure(model, tokenizer, probes: list[Probe], heldout, n_blocks: int, chunk: int,
            max_context: int) -> dict[str, Any]:
    """Held-out loss and probes of ``model`` now (flat ``probe/...`` keys)."""
    t0 = time.time()
    out: dict[str, Any] = {}
    loss = heldout_loss(model, heldout, n_blocks) if heldout is not None else None
    if loss is not None:
        out["heldout_loss"] = loss
    if probes:
        out.update(run_probes(LMScorer(model, tokenizer, max_context=max_context, chunk=chunk), probes))
    out["seconds"] = round(time.time() - t0, 2)
    return flatten(PROBE, out)


def make_callbacks(*, tokenizer, probes, heldout, probe_cfg: dict[str, Any], max_context: int,
                   tokens_per_step: int, progress_path: Path, console):
    from transformers import TrainerCallback

    every = int(probe_cfg.get("every") or 0)
    n_blocks = int(probe_cfg.get("heldout_blocks", 64))
    chunk = int(probe_cfg.get("chunk", 16))

    class Probes(TrainerCallback):
        """Measures at step 0 (before the first update), every ``every`` steps and at the end."""

        def __init__(self):
            self.started = time.time()
            self.start_step: int | None = None
            self.last: dict[str, Any] = {}

        def _have(self, state, step: int) -> bool:
            return any(e.get("step") == step and f"{PROBE}seconds" in e for e in state.log_history)

        def _measure(self, state, model) -> None:
            step = state.global_step
            if self._have(state, step):
                return
            entry = {"step": step, "tokens": step * tokens_per_step,
                     **measure(model, tokenizer, probes, heldout, n_blocks, chunk, max_context)}
            state.log_history.append(entry)
            self.last = entry
            console.print("[pretrain] step {step}: {desc}".format(step=step, desc=describe(entry)))
            self._progress(state)

        def _progress(self, state) -> None:
            if self.start_step is None:
                self.start_step = state.global_step
            done = state.global_step - self.start_step
            elapsed = time.time() - self.started
            rate = done * tokens_per_step / elapsed if done and elapsed > 0 else None
            left = (state.max_steps - state.global_step) * elapsed / done if done else None
            losses = [e["loss"] for e in state.log_history if "loss" in e]
            write_json(progress_path, {
                "step": state.global_step, "max_steps": state.max_steps,
                "tokens": state.global_step * tokens_per_step, "tokens_per_second": rate,
                "seconds_this_session": round(elapsed, 1), "seconds_left": round(left, 1) if left else None,
                "train_loss": losses[-1] if losses else None, "last_probe": self.last,
                "updated_at": time.strftime("%Y-%m-%dT%H:%M:%S%z")})

        def on_step_begin(self, args, state, control, model=None, **kw):
            if self.start_step is None:
                self.start_step = state.global_step
            if state.global_step == 0 and every:
                self._measure(state, model)

        def on_step_end(self, args, state, control, model=None, **kw):
            if every and state.global_step % every == 0:
                self._measure(state, model)

        def on_log(self, args, state, control, logs=None, **kw):
            self._progress(state)
            if logs and "loss" in logs:
                done = state.global_step - (self.start_step or 0)
                elapsed = time.time() - self.started
                console.print(f"[pretrain] step {state.global_step}/{state.max_steps}: loss {float(logs['loss']):.4f}, "
                              f"lr {float(logs.get('learning_rate', 0)):.2e}, "
                              f"{done * tokens_per_step / max(elapsed, 1e-9):,.0f} tokens/s (probes included), "
                              f"{elapsed:,.0f} s")

        def on_train_end(self, args, state, control, model=None, **kw):
            self._measure(state, model)

    return Probes()


def describe(entry: dict[str, Any]) -> str:
    parts = []
    if f"{PROBE}heldout_loss" in entry:
        parts.append(f"held-out loss {entry[PROBE + 'heldout_loss']:.3f}")
    if f"{PROBE}room/accuracy" in entry:
        parts.append(f"room {entry[PROBE + 'room/accuracy']:.2f} (mentioned {entry[PROBE + 'room/accuracy_mentioned']:.2f}; "
                     f"chance {entry[PROBE + 'room/chance_majority']:.2f} / {entry[PROBE + 'room/chance_uniform_mentioned']:.2f})")
    if f"{PROBE}object/in_room_greedy" in entry:
        parts.append(f"object in room: greedy {entry[PROBE + 'object/in_room_greedy']:.2f}, "
                     f"argmax {entry[PROBE + 'object/in_room']:.2f} (chance {entry[PROBE + 'object/chance_uniform']:.2f}), "
                     f"among mentioned {entry[PROBE + 'object/in_room_mentioned']:.2f} "
                     f"(chance {entry[PROBE + 'object/chance_uniform_mentioned']:.2f})")
    return "; ".join(parts) or "no probes"


@dataclass
class PretrainJob(Job):
    """Next-token pretraining of a fresh model (``built_model``, from ``pretrain.arch``; ``base`` is
    the tokenizer's folder) on ``data`` = packed blocks (:class:`~.tokens.PackedBlocks`), with the
    plain HF Trainer (every token's loss, no chat mask) and ``callbacks`` (:func:`make_callbacks`)
    in place of its own progress printers. ``args``: :func:`training_args`."""

    built_tokenizer: Any = None
    built_model: Any = None
    callbacks: list = field(default_factory=list)

    def tokenizer(self):
        return self.built_tokenizer

    def policy(self):
        return self.built_model

    def dataset(self, tokenizer):
        return self.data

    def trainer(self, model, tokenizer, dataset, peft):
        from transformers import Trainer, default_data_collator
        from transformers.trainer_callback import PrinterCallback, ProgressCallback

        trainer = Trainer(model=model, args=self.args, train_dataset=dataset, data_collator=default_data_collator)
        for default in (PrinterCallback, ProgressCallback):  # one progress line per log step instead (make_callbacks)
            trainer.remove_callback(default)
        for callback in self.callbacks:
            trainer.add_callback(callback)
        return trainer


def training_args(out_dir: str, train: dict[str, Any], seed: int, report_to: str):
    from transformers import TrainingArguments

    return TrainingArguments(
        output_dir=out_dir,
        per_device_train_batch_size=int(train["batch_size"]),
        gradient_accumulation_steps=int(train.get("grad_accum", 1)),
        learning_rate=float(train["lr"]),
        lr_scheduler_type=train.get("scheduler", "cosine"),
        warmup_steps=train.get("warmup_ratio", 0.0),  # a float below 1 is a ratio of the total steps
        weight_decay=float(train.get("weight_decay", 0.0)),
        adam_beta2=float(train.get("adam_beta2", 0.999)),
        max_grad_norm=float(train.get("max_grad_norm", 1.0)),
        num_train_epochs=float(train.get("epochs", 1)),
        max_steps=int(train.get("max_steps") or -1),
        logging_steps=int(train.get("logging_steps", 25)),
        save_strategy="steps",
        save_steps=int(train["save_steps"]),
        save_total_limit=train.get("save_total_limit"),
        bf16=bool(train.get("bf16", False)),
        seed=seed,
        data_seed=seed,
        report_to=report_to,
        disable_tqdm=True,
        dataloader_num_workers=0,
        use_cpu=bool(train.get("use_cpu", True)),
    )


def steps_of(n_blocks: int, train: dict[str, Any]) -> int:
    """Optimizer steps the run will take (as the Trainer counts them)."""
    if train.get("max_steps"):
        return int(train["max_steps"])
    per_epoch = max(1, math.ceil(n_blocks / int(train["batch_size"])) // int(train.get("grad_accum", 1)))
    return int(math.ceil(per_epoch * float(train.get("epochs", 1))))
