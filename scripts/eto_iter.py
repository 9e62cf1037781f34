"""One ETO iteration (explore -> pairs -> dpo -> eval on dev) from the latest policy (make eto-iter).

    python scripts/eto_iter.py [hydra overrides]
"""

from pathlib import Path

import hydra

from eto_train.interrupt import interruptible
from eto_train.model.load import CheckpointError
from eto_train.stage import isolate_sweep_job
from eto_train.stages import eto


@hydra.main(config_path="../configs", config_name="config", version_base="1.3")
def main(cfg) -> None:
    with interruptible(cfg):  # Ctrl-C: one line saying what was kept, exit 130
        isolate_sweep_job(cfg)  # under -m: one run folder per job
        k, policy = eto.latest_policy(cfg)
        if k >= cfg.eto.iterations:
            print(f"[eto-iter] {k} iterations done: the cap eto.iterations={cfg.eto.iterations} is reached")
            return
        if not (Path(policy) / "config.json").exists():
            raise CheckpointError(f"{policy}: no behavior-cloned policy yet (run `make bc` first)")
        eto.run_iteration(cfg, k + 1, policy)


if __name__ == "__main__":
    with interruptible():  # and while Hydra starts up
        main()
