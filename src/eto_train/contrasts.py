"""What each contrast kind (``eto.pairs.contrast``) is made of: the one place that decides it.

A contrast is a set of pair sources; exploration plays what they need and the pairs stage builds
what they name (stages/eto/explore.py, stages/eto/pairs.py), and the config offers their names
(``eto.pairs.contrast``). Adding a kind means adding a row here and, if it needs a new source, the
source itself. This module imports nothing of the project: the config sits above it.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Contrast:
    name: str
    trajectory: bool = False  # the expert's whole trajectory against an explored one (the paper's)
    step: bool = False        # the expert's action against the policy's at a step (App. B): first divergence or
                              # continuations from expert prefixes (pairs.step_positions)
    values: bool = False      # Monte-Carlo step values: sampled continuations after each of the two actions
    anchor: bool = False      # best against worst action where sampled episodes share the whole history
    mixed: bool = False       # trajectory and step pairs kept at pairs.mixture_step_fraction of the union

    @property
    def expert_states(self) -> bool:
        """Whether exploration reads the expert trajectories to play from their states (step, values)."""
        return self.step or self.values

    @property
    def sampled_states(self) -> bool:
        """Whether the pairs need several sampled episodes per task (explore.samples >= 2, do_sample)."""
        return self.anchor


KINDS: dict[str, Contrast] = {c.name: c for c in (
    Contrast("trajectory", trajectory=True),
    Contrast("step", step=True),
    Contrast("mixture", trajectory=True, step=True, mixed=True),
    Contrast("step_value", values=True),
    Contrast("anchor", anchor=True),
)}
CONTRASTS = tuple(KINDS)  # eto.pairs.contrast's choices


def contrast_kind(name: str) -> Contrast:
    """The kind named ``name`` (the config has checked it is one of :data:`CONTRASTS`)."""
    return KINDS[name]
