"""Does a policy read its observation? First moves and takes against chance (make reading).

    python scripts/reading.py [hydra overrides]   e.g. 'reading.policies={bc: runs/demo/bc/model}'
"""

import hydra

from eto_train.interrupt import interruptible
from eto_train.stage import isolate_sweep_job
from eto_train.stages import reading


@hydra.main(config_path="../configs", config_name="config", version_base="1.3")
def main(cfg) -> None:
    with interruptible(cfg):  # Ctrl-C: one line saying what was kept, exit 130
        isolate_sweep_job(cfg)  # under -m: one run folder per job
        reading.run(cfg)


if __name__ == "__main__":
    with interruptible():  # and while Hydra starts up
        main()
