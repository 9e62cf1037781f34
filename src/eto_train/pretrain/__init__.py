"""Pretraining a small causal LM on text-game transcripts (``make pretrain``).

The CPU demo's policy is trained from scratch on a few hundred gold paths and does not read
its observations. This package builds the analogue of pretraining for the CPU scale:

- :mod:`.transcripts`: many TextWorldExpress games and parameter settings played by gold
  paths, random valid (and some invalid) actions, and gold paths with detours, rendered in the
  policy's chat layout, on seeds disjoint from every split of ``configs/env/twx.yaml``, streamed
  to JSONL shards;
- :mod:`.tokens`: the byte-level BPE tokenizer trained on them and the token stream packed into
  fixed-length blocks (a memory-mapped file);
- :mod:`.probes`: reading probes on held-out transcripts (which room lies behind an exit; which
  object the room holds), by the model's log-probabilities;
- :mod:`.train`: next-token training on every token with the HF Trainer (checkpoints, resume),
  probes every N steps; :mod:`.card`: the model card of a finished run.

The stage itself is :mod:`eto_train.stages.pretrain`.
"""
