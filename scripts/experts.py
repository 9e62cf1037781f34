"""Expert (gold-path) trajectories of the training tasks (make experts).

    python scripts/experts.py [hydra overrides]
"""

import hydra

from eto_train.interrupt import interruptible
from eto_train.stage import isolate_sweep_job
from eto_train.stages import experts


@hydra.main(config_path="../configs", config_name="config", version_base="1.3")
def main(cfg) -> None:
    with interruptible(cfg):  # Ctrl-C: one line saying what was kept, exit 130
        isolate_sweep_job(cfg)  # under -m: one run folder per job
        experts.run(cfg)


if __name__ == "__main__":
    with interruptible():  # and while Hydra starts up
        main()
