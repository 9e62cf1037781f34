"""Stage `export` (make export): training data with fields dropped and secrets redacted.

    eto-train export export.inputs=[runs/demo/experts/train.jsonl] \\
        export.output=runs/demo/export/train.jsonl export.drop_fields=[policy.path]

The settings are the config's ``export`` block (configs/config.yaml); the report (counts,
redactions) is printed as JSON and returned.
"""

from __future__ import annotations

import json
from typing import Any

from ..export import ExportConfig, export_training_data
from ..config import Config


def run(cfg: Config) -> dict[str, Any]:
    ex = cfg.export.plain()  # the keys given: ExportConfig's own defaults for the rest
    inputs, output = ex.pop("inputs"), ex.pop("output")
    report = export_training_data(list(inputs), output, ExportConfig(**ex))
    print(json.dumps(report, indent=1))
    return report
