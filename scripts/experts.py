"""Expert (gold-path) trajectories of the training tasks (make experts).

    python scripts/experts.py [hydra overrides]
"""

import hydra

from eto_train.stages import experts
from eto_train.stage import isolate_sweep_job


@hydra.main(config_path="../configs", config_name="config", version_base="1.3")
def main(cfg) -> None:
    isolate_sweep_job(cfg)  # under -m: one run folder per job
    experts.run(cfg)


if __name__ == "__main__":
    main()
