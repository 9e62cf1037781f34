"""Which seed positions of the TextWorldExpress folds pretraining plays: every position no env split uses,
minus the held-out ones (:func:`pretrain_seeds`). Plain arithmetic on the split specs, no game loaded, so
the config schema checks ``pretrain.data.heldout`` against the splits without importing the transcripts'
player (which loads the adapter, which imports the schema)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable

FOLDS = ("train", "dev", "test")
DEFAULT_FOLDS = ("train", "test")   # never dev: unseen and test_unseen are dev-fold seeds
FOLD_SIZE = 1000                    # valid seeds per fold of every TextWorldExpress game


def split_positions(splits: dict[str, dict[str, Any]]) -> dict[str, set[int]]:
    """Seed positions each fold's env splits use (every game of the env shares them)."""
    used: dict[str, set[int]] = {f: set() for f in FOLDS}
    for spec in splits.values():
        start, count = int(spec["start"]), int(spec["count"])
        used.setdefault(spec["fold"], set()).update(range(start, start + count))
    return used


@dataclass(frozen=True)
class SeedSets:
    """Positions (in each game's list of valid seeds of a fold) for pretraining."""

    train: dict[str, list[int]]      # fold -> positions transcripts are trained on
    heldout: dict[str, list[int]]    # fold -> positions for the probes and the held-out loss
    excluded: dict[str, list[int]]   # fold -> positions the env splits use (never played here)

    def summary(self) -> dict[str, Any]:
        def ranges(xs: list[int]) -> list[list[int]]:
            out: list[list[int]] = []
            for x in sorted(xs):
                if out and x == out[-1][1] + 1:
                    out[-1][1] = x
                else:
                    out.append([x, x])
            return out
        return {part: {f: ranges(p) for f, p in getattr(self, part).items() if p}
                for part in ("train", "heldout", "excluded")}


def avoided_splits(env: dict[str, Any]) -> dict[str, Any] | None:
    """The TextWorldExpress splits pretraining must avoid: the run's env section's when it is twx, else the
    repository's configs/env/twx.yaml's (None when that file is not there)."""
    if env.get("name") == "twx":
        return env["splits"]
    from omegaconf import OmegaConf

    from ..layout import CONFIGS

    twx = CONFIGS / "env" / "twx.yaml"
    return OmegaConf.to_container(OmegaConf.load(twx), resolve=True)["splits"] if twx.is_file() else None


def pretrain_seeds(splits: dict[str, dict[str, Any]], heldout: dict[str, Any],
                   folds: Iterable[str] = DEFAULT_FOLDS, fold_size: int = FOLD_SIZE) -> SeedSets:
    """The pretraining and held-out positions: every position of ``folds`` that no env split
    (``env.splits``: train, dev, seen, unseen, test_*) uses, minus the held-out ones.

    ``heldout`` is ``{fold, start, count}``; it must avoid the env splits too.
    """
    folds = list(folds)
    bad = [f for f in folds if f not in FOLDS]
    if bad:
        raise ValueError(f"pretrain.data.folds: {bad} not among {list(FOLDS)}")
    used = split_positions(splits)
    h_fold, h_start, h_count = heldout["fold"], int(heldout["start"]), int(heldout["count"])
    if h_fold not in FOLDS:
        raise ValueError(f"pretrain.data.heldout.fold: {h_fold!r} not among {list(FOLDS)}")
    h_pos = list(range(h_start, h_start + h_count))
    clash = sorted(set(h_pos) & used[h_fold])
    if clash:
        raise ValueError(f"pretrain.data.heldout: positions {clash[0]}..{clash[-1]} of the {h_fold} fold "
                         "are used by an env split; held-out transcripts must avoid every split")
    if h_pos and (h_pos[0] < 0 or h_pos[-1] >= fold_size):
        raise ValueError(f"pretrain.data.heldout: positions must lie in 0..{fold_size - 1}")
    train = {f: [p for p in range(fold_size) if p not in used[f] and not (f == h_fold and p in h_pos)]
             for f in folds}
    return SeedSets(train=train, heldout={h_fold: h_pos} if h_pos else {},
                    excluded={f: sorted(p) for f, p in used.items() if p})
