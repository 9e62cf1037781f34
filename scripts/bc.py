"""Behavior cloning on the expert trajectories (make bc).

    python scripts/bc.py [hydra overrides]
"""

import hydra

from eto_train.stages import bc


@hydra.main(config_path="../configs", config_name="config", version_base="1.3")
def main(cfg) -> None:
    bc.run(cfg)


if __name__ == "__main__":
    main()
