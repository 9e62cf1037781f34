"""Export training data with fields dropped and secrets redacted (configs/config.yaml: export).

    python scripts/export_data.py export.inputs=[runs/demo/experts/train.jsonl] \
        export.output=runs/demo/export/train.jsonl export.drop_fields=[policy.path]
"""

import json

import hydra

from eto_train.dataio import ExportConfig, export_training_data
from eto_train.interrupt import interruptible
from eto_train.stage import to_plain


@hydra.main(config_path="../configs", config_name="config", version_base="1.3")
def main(cfg) -> None:
    with interruptible(cfg, resume=False):  # Ctrl-C: one line, exit 130
        ex = to_plain(cfg.export)
        inputs, output = ex.pop("inputs"), ex.pop("output")
        report = export_training_data(list(inputs), output, ExportConfig(**ex))
        print(json.dumps(report, indent=1))


if __name__ == "__main__":
    with interruptible(resume=False):  # and while Hydra starts up
        main()
