"""Pretrain a small causal LM on text-game transcripts (make pretrain).

    python scripts/pretrain.py [hydra overrides]     # configs/pretrain/cpu.yaml

Writes runs/<run_name>/pretrain/: data/ (transcript shards), tokens/, checkpoints/, progress.json,
probes.json and model/ (the base: safetensors, tokenizer, MODEL_CARD.md, loss.png). A killed run
resumes where it stopped when started again with the same overrides. BC from the base:
    make bc ARGS="model.path=runs/<run_name>/pretrain/model model.build=false"
"""

import shlex
import sys

import hydra

from eto_train.interrupt import interruptible
from eto_train.stage import isolate_sweep_job
from eto_train.stages import pretrain


@hydra.main(config_path="../configs", config_name="config", version_base="1.3")
def main(cfg) -> None:
    with interruptible(cfg):  # Ctrl-C: one line saying what was kept, exit 130
        isolate_sweep_job(cfg)  # under -m: one run folder per job
        pretrain.run(cfg, command=" ".join(["python scripts/pretrain.py", *map(shlex.quote, sys.argv[1:])]))


if __name__ == "__main__":
    with interruptible():  # and while Hydra starts up
        main()
