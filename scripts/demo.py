"""The whole story at CPU scale (make demo): bc -> ETO iterations -> compare -> reading -> report.md.

Each stage skips what is already done, so an interrupted demo resumes where it stopped.

    python scripts/demo.py [hydra overrides]
"""

import hydra
from rich.console import Console

from eto_train.interrupt import interruptible
from eto_train.stage import isolate_sweep_job
from eto_train.stages import compare, eto, reading, report


@hydra.main(config_path="../configs", config_name="config", version_base="1.3")
def main(cfg) -> None:
    with interruptible(cfg):  # Ctrl-C: one line saying what was kept, exit 130
        isolate_sweep_job(cfg)  # under -m: one run folder per job
        result = eto.run(cfg)  # experts, base model, bc, then iterations with early stopping on dev
        compare.run(cfg)   # trajectory / step / mixture and the SFT control from the same BC
        reading.run(cfg, {"bc": f"{cfg.paths.bc}/model",  # does each read its observation? (the precondition)
                          **({"eto_best": result["best_policy"]} if result.get("best_iteration") else {})})
        Console(markup=False).print(f"[demo] report: {report.run(cfg)}")


if __name__ == "__main__":
    with interruptible():  # and while Hydra starts up
        main()
