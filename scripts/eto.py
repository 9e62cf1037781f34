"""The whole ETO loop: bc if needed, then capped iterations with early stopping (make eto).

    python scripts/eto.py [hydra overrides]
"""

import hydra

from eto_train.interrupt import interruptible
from eto_train.stage import isolate_sweep_job
from eto_train.stages import eto


@hydra.main(config_path="../configs", config_name="config", version_base="1.3")
def main(cfg) -> None:
    with interruptible(cfg):  # Ctrl-C: one line saying what was kept, exit 130
        isolate_sweep_job(cfg)  # under -m: one run folder per job
        eto.run(cfg)


if __name__ == "__main__":
    with interruptible():  # and while Hydra starts up
        main()
