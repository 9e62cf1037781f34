"""Keys written in two homes (issue 38, item 1): compose the run config with the given overrides and list every
key the YAML sets that also carries a default in config.py's schema, with the same value or a different one.

    .venv/bin/python scripts/config_homes.py [-v] [hydra overrides]

A measurement for the refactor; tests/test_configs.py keeps bc.* and eto.dpo.* at none and the rest from growing."""

from __future__ import annotations

import sys

from hydra import compose, initialize_config_dir
from pydantic import BaseModel

from eto_train import layout
from eto_train.config import _Overrides, load


def homes(obj: BaseModel, path: list[str], same: list, diff: list) -> None:
    fields = type(obj).model_fields
    for k in sorted(obj.model_fields_set & fields.keys()):
        v, f = getattr(obj, k), fields[k]
        if isinstance(v, BaseModel):
            homes(v, [*path, k], same, diff)
        elif not f.is_required() and not isinstance(obj, _Overrides):  # an override's unset is "the other's"
            d = f.get_default(call_default_factory=True)
            if d is not None:  # an optional key's null default is its absence (the library's default), no value
                (same if d == v else diff).append((".".join([*path, k]), d, v))


def main(argv: list[str]) -> None:
    verbose, overrides = "-v" in argv, [a for a in argv if a != "-v"]
    with initialize_config_dir(str(layout.CONFIGS), version_base="1.3", job_name="config_homes"):
        cfg = load(compose("config", overrides=overrides))
    same, diff = [], []
    homes(cfg, [], same, diff)
    print(f"{len(same)} keys with the same value in the YAML and the schema, {len(diff)} with another")
    for key, d, v in diff:
        print(f"  differs  {key}: schema {d!r}, YAML {v!r}")
    if verbose:
        for key, d, _ in same:
            print(f"  same     {key}: {d!r}")


if __name__ == "__main__":
    main(sys.argv[1:])
