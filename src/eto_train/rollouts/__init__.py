"""Rollouts: a policy plays episodes in the environments.

- :mod:`.loop`: the batched multi-turn loop (:func:`~.loop.run_rollouts`, :class:`~.loop.WorkItem`,
  :class:`~.loop.RolloutConfig`, the HF :class:`~.loop.Policy`): many episodes in lockstep, one
  generate call per step, retries and environment failures handled.
- :mod:`.kvbatch`: a batch of conversations whose KV cache persists across turns (the HF policy's session).
- :mod:`.vllm_engine`: the vLLM policy for the same loop (``rollout.backend=vllm``).
- :mod:`.progress`: the progress bar a play shows on a terminal.
- :mod:`.play`: plays a work list into a stage folder (eval, explore): shards, resume, merge.
"""
