"""Evaluate a policy on held-out splits (make eval).

    python scripts/evaluate.py [hydra overrides]
"""

import hydra

from eto_train.stages import evaluate


@hydra.main(config_path="../configs", config_name="config", version_base="1.3")
def main(cfg) -> None:
    evaluate.run(cfg)


if __name__ == "__main__":
    main()
