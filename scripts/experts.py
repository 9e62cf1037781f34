"""Expert (gold-path) trajectories of the training tasks (make experts).

    python scripts/experts.py [hydra overrides]
"""

import hydra

from eto_train.stages import experts


@hydra.main(config_path="../configs", config_name="config", version_base="1.3")
def main(cfg) -> None:
    experts.run(cfg)


if __name__ == "__main__":
    main()
