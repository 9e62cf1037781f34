"""Build the offline tiny base model (make model).

    python scripts/build_model.py [hydra overrides]
"""

import hydra

from eto_train.stages import model


@hydra.main(config_path="../configs", config_name="config", version_base="1.3")
def main(cfg) -> None:
    model.run(cfg)


if __name__ == "__main__":
    main()
