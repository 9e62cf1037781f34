"""TRL's fused LM head on the CPU: project only the positions that have a label.

TRL's SFT and DPO trainers get per-token log-probs from a fused LM head
(``trl.trainer.utils.add_fused_lm_head``): the hidden states go through the head in tiles with an
online log-sum-exp, so the ``tokens x vocab`` logits never exist at once. On Triton devices (CUDA,
XPU) it projects only the positions whose label is not -100. Everywhere else it projects *every*
position and zeroes the masked ones afterwards, to keep tile shapes static for compilers that
would otherwise recompile on every batch (Neuron). The CPU trains eagerly: nothing recompiles there.

In an agent's conversation most positions carry no label: the instruction, the one-shot example,
the observations and the template are masked, the agent's turns are not (BC: the loss on the
agent's turns; DPO: the action tokens of the completions). On SmolLM2-135M (a 49,152-token vocabulary)
the head and its log-sum-exp over every position took about a third of a BC step on the CPU
(docs/lab/bench.md, "where the time goes"). TRL has no option for it, so :func:`score_labelled_only`
switches the one decision (``compact``) to "labelled positions only" on the CPU as well. Nothing
else changes: masked positions' log-probs are zero either way, and the labelled ones are computed
by the same tiles.

Behind ``runtime.library_hooks`` (:func:`eto_train.runtime.library_hooks`): by default in place where training runs
on the CPU, not on a GPU (where TRL projects the labelled positions alone already: the patch would change nothing).

Checked against TRL 1.16.0 (with transformers 5.24.0): ``trl/trainer/utils.py`` imports ``_use_triton`` from
``trl.kernels.chunked_logprob`` (:61) and calls it by that module-level name once per fused head's forward
(:1642, ``compact = _use_triton(hidden_states.device)``). A TRL without that name leaves TRL's behaviour as it is
(:func:`score_labelled_only` returns False); another TRL that keeps the name but changes its meaning must be read
again before this is trusted (tests/test_lm_head.py compares the log-probs with and without the patch).
"""

from __future__ import annotations

import torch

_PATCHED = "_eto_labelled_only"


def score_labelled_only(enabled: bool | None = None) -> bool:
    """Make TRL's fused LM head project only labelled positions on the CPU (``enabled``), or restore
    TRL's own choice (``enabled=False``, the bench's baseline); ``None``: as ``runtime.library_hooks`` says
    (:func:`eto_train.runtime.library_hooks`). Idempotent. Returns whether the patch is in place; False also
    when this TRL has no such decision to patch (then TRL's behaviour stands)."""
    import trl.trainer.utils as trl_utils

    if enabled is None:
        from ..runtime import library_hooks

        enabled = library_hooks()

    current = getattr(trl_utils, "_use_triton", None)
    if current is None:  # a TRL without the fused head's switch: nothing to patch
        return False
    original = getattr(current, "__wrapped__", current)
    if not enabled:
        trl_utils._use_triton = original
        return False
    if getattr(current, _PATCHED, False):
        return True

    def compact(device: torch.device) -> bool:
        # In trl.trainer.utils this name only decides whether the head projects the labelled positions alone
        # (the kernels module keeps its own, which picks Triton or the torch tiles).
        return device.type == "cpu" or original(device)

    compact.__wrapped__ = original
    setattr(compact, _PATCHED, True)
    trl_utils._use_triton = compact
    return True
