"""Multi-turn DPO where only the agent's action tokens count (the ETO objective).

TRL's DPOTrainer scores every completion token. In a multi-turn completion the observations
(user turns) sit inside the completion, so TRL would count environment text in the policy's
log-probabilities. Two small extensions fix that without touching the loss: the dataset
carries a per-token action mask for chosen and rejected, and the collator hands that mask to
the trainer as its ``completion_mask``. Everything downstream (log-probs, reference log-probs,
every loss type, the optional SFT term) then sees action tokens only.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from trl import DPOConfig, DPOTrainer
from trl.trainer.dpo_trainer import DataCollatorForPreference

from ..config import DPOSection
from .masks import assistant_token_mask

MASK_COLUMNS = ("chosen_action_mask", "rejected_action_mask")


def tokenize_pair(tok, prompt: list[dict], chosen: list[dict], rejected: list[dict]) -> dict[str, list[int]]:
    """Token ids of prompt / chosen / rejected and the action masks of the two completions."""
    c_ids, c_mask = assistant_token_mask(tok, prompt + chosen)
    r_ids, r_mask = assistant_token_mask(tok, prompt + rejected)
    n = 0  # shared prefix: the prompt as both sides render it
    while n < min(len(c_ids), len(r_ids)) and c_ids[n] == r_ids[n] and not c_mask[n] and not r_mask[n]:
        n += 1
    return {"prompt_ids": c_ids[:n], "chosen_ids": c_ids[n:], "rejected_ids": r_ids[n:],
            "chosen_action_mask": c_mask[n:], "rejected_action_mask": r_mask[n:]}


class ActionMaskPreferenceCollator(DataCollatorForPreference):
    """TRL's preference collator with ``completion_mask`` = the action tokens only."""

    def torch_call(self, examples: list[dict[str, Any]]) -> dict[str, Any]:
        out = super().torch_call(examples)
        rows = [[0] * len(e["prompt_ids"]) + list(e["chosen_action_mask"]) for e in examples] + \
               [[0] * len(e["prompt_ids"]) + list(e["rejected_action_mask"]) for e in examples]
        width = out["input_ids"].shape[1]
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for i, r in enumerate(rows):
            r = r[:self.max_length] if self.max_length is not None else r  # same keep_start cut as the ids
            r = r[:width]
            mask[i, :len(r)] = torch.tensor(r, dtype=torch.long)
        out["completion_mask"] = mask
        return out


class ActionMaskedDPOTrainer(DPOTrainer):
    """DPOTrainer on multi-turn pairs, log-probs over action tokens only."""

    def _prepare_dataset(self, dataset, processing_class, args, dataset_name):
        from accelerate import PartialState

        tok, limit = self._tokenizer, args.max_length  # not ``args``: its hash differs by rank (the cache's name)

        def fn(ex):
            return tokenize_pair(tok, ex["prompt"], ex["chosen"], ex["rejected"])

        # a file-backed dataset (data-parallel DPO: recipe.DPOJob.shared) caches each map beside its file: the
        # main process (global rank 0) maps first and writes the caches, the others load them (same
        # fingerprints); one writer per file, also for the local main process of another machine
        with PartialState().main_process_first():
            ds = dataset.map(fn, remove_columns=[c for c in dataset.column_names if c not in ("pair_id",)],
                             desc=f"Tokenizing {dataset_name} pairs with action masks")
            if limit is not None:
                ds = ds.filter(lambda ex: len(ex["prompt_ids"]) < limit)
            if ds._indices is not None and ds.cache_files:  # the filter's index mapping, made a file here once: TRL's
                ds = ds.flatten_indices()  # precomputed reference log-probs would flatten it on every rank
        return ds

    def _set_signature_columns_if_needed(self):
        super()._set_signature_columns_if_needed()
        self._signature_columns = list(self._signature_columns) + list(MASK_COLUMNS)


# What the recipe sets itself, whatever a section says (besides output_dir, seed, data_seed and report_to)
FIXED = {
    "logging_nan_inf_filter": False,  # NaN/Inf logged as is: stops training (save.finite_guard)
    "disable_tqdm": True,             # rich progress instead
    "dataloader_num_workers": 0,
    "remove_unused_columns": False,   # the action masks ride along (ActionMaskedDPOTrainer)
}


def dpo_arguments(section: DPOSection, out_dir: str | Path, seed: int) -> DPOConfig:
    """TRL's ``DPOConfig`` of one iteration's ``eto.dpo`` ``section`` (``cfg.eto.dpo.at(iteration)``),
    whose keys are DPOConfig's own but eto-train's (``DPOSection.trl_arguments``), with the
    accumulation that reaches ``effective_batch`` on this many processes; checkpoints go to
    ``out_dir``."""
    from .. import tracking
    from ..distributed import grad_accum

    return DPOConfig(**{**section.trl_arguments(), "gradient_accumulation_steps": grad_accum(section)}, **FIXED,
                     output_dir=str(out_dir), seed=seed, data_seed=seed, report_to=tracking.report_to())


def fsdp_reference(base: str, model_cfg: dict[str, Any], trust_remote_code: bool = False):
    """The frozen DPO reference under FSDP with full fine-tuning, else None (TRL's own choice).

    Given ``ref_model=None`` under FSDP, TRL 1.16 loads the reference itself (trl/trainer/
    dpo_trainer.py:908-927, also with ``precompute_ref_log_probs``: the policy is not sharded
    before ``train``, :909-913), sets ``device_map=None`` only for MULTI_GPU and DEEPSPEED (:920-921),
    and its loader then defaults to ``device_map="auto"`` on a GPU (trl/trainer/utils.py:1350-1351):
    on every rank a whole copy spread over every GPU, with dispatch hooks, before ``prepare_fsdp``
    shards it (:987-988), in the policy's dtype (:924; fp32 for full fine-tuning). Here it is
    loaded on the CPU in ``model.dtype``, in eval mode and frozen; TRL shards it onto the rank's
    GPU. With ``precompute_ref_log_probs`` it is used once and dropped (:func:`make_dpo_trainer`)."""
    from ..distributed import fsdp_enabled
    from ..model.load import load_model, model_kwargs

    if not fsdp_enabled() or model_cfg.get("lora"):
        return None
    ref = load_model(base, dtype=model_cfg["dtype"], trust_remote_code=trust_remote_code, **model_kwargs(model_cfg))
    return ref.eval().requires_grad_(False)


def make_dpo_trainer(model, ref_model, tokenizer, dataset, args: DPOConfig, peft_config=None):
    from trl.trainer.callbacks import RichProgressCallback

    from .lm_head import score_labelled_only
    from .right_padding import unpad_right_padding

    score_labelled_only()  # the action tokens only through the LM head on a CPU (lm_head.py; runtime.library_hooks)
    for m in (model, ref_model):  # rows flushed left, padded on the right: packed, no padding (right_padding.py)
        if m is not None:
            unpad_right_padding(m)
    collator = ActionMaskPreferenceCollator(pad_token_id=tokenizer.pad_token_id, max_length=args.max_length,
                                            truncation_mode=args.truncation_mode)
    trainer = ActionMaskedDPOTrainer(model=model, ref_model=ref_model, args=args, train_dataset=dataset,
                                     processing_class=tokenizer, data_collator=collator, peft_config=peft_config,
                                     callbacks=[RichProgressCallback()])
    if ref_model is not None and args.precompute_ref_log_probs:
        # the log-probs are in the dataset now (precomputed in __init__, dpo_trainer.py:1013-1018) and the loss
        # reads them from the batch (:1318); TRL drops only a reference it loaded itself (:1033-1034)
        trainer.ref_model = None
        from ..distributed import free_accelerator_memory

        free_accelerator_memory()
    return trainer
