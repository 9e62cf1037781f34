"""Contrast variants (trajectory, step, mixture) and an SFT control vs BC (make compare-contrast).

    python scripts/compare.py [hydra overrides]
"""

import hydra

from eto_train.stages import compare
from eto_train.stage import isolate_sweep_job


@hydra.main(config_path="../configs", config_name="config", version_base="1.3")
def main(cfg) -> None:
    isolate_sweep_job(cfg)  # under -m: one run folder per job
    compare.run(cfg)


if __name__ == "__main__":
    main()
