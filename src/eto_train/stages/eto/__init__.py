"""ETO (`make eto`, `make eto-iter`): the loop in :mod:`.loop`, its steps in :mod:`.explore`,
:mod:`.pairs` and :mod:`.dpo`, in the order one iteration runs them."""

from .loop import (Round, Selection, check_selection, explore_pair_train, latest_policy, prepare_bc, run,
                   run_iteration, run_next_iteration, select)

__all__ = ["Round", "Selection", "check_selection", "explore_pair_train", "latest_policy", "prepare_bc", "run",
           "run_iteration", "run_next_iteration", "select"]
