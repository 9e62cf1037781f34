"""Rebuild a finished demo's report.md from its run folder (no training, no rollouts).

    python scripts/report.py run_name=demo
"""

import hydra

from eto_train.interrupt import interruptible
from eto_train.stage import isolate_sweep_job
from eto_train.stages import report


@hydra.main(config_path="../configs", config_name="config", version_base="1.3")
def main(cfg) -> None:
    with interruptible(cfg, resume=False):  # Ctrl-C: one line, exit 130
        isolate_sweep_job(cfg)  # under -m: one run folder per job
        print(report.run(cfg))


if __name__ == "__main__":
    with interruptible(resume=False):  # and while Hydra starts up
        main()
