"""The whole ETO loop: bc if needed, then capped iterations with early stopping (make eto).

    python scripts/eto.py [hydra overrides]
"""

import hydra

from eto_train.stages import eto


@hydra.main(config_path="../configs", config_name="config", version_base="1.3")
def main(cfg) -> None:
    eto.run(cfg)


if __name__ == "__main__":
    main()
