"""`eto-train demo [hydra overrides]`: runs ``scripts/demo.sh``, the demo's one home.

The script is the demo, top to bottom: one ``eto-train <stage>`` line per stage (experts, model,
bc, eval, eto, compare, reading, report) with the arithmetic of its sizes. ``make demo`` runs it
with its settings (``DEMO_ARGS`` in the script: the shipped base, 100 demonstrations per game,
two iterations, ...); ``eto-train demo`` runs the same lines on the plain config and your
overrides only (``DEMO_ARGS`` empty), as the stage did before the script existed.

Each line is its own process: a stage that dies of a signal (a kill point, a SIGKILL) ends
``eto-train demo`` with that signal too, so that it reads as a killed ``eto-train <stage>``; its
exit status otherwise (0, 2 for a config or input error, 130 after a Ctrl-C) is the demo's.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

from ..layout import REPO_ROOT

SCRIPT = REPO_ROOT / "scripts" / "demo.sh"


def main(args: list[str]) -> int:
    """Run the script with this Python and ``args``; its exit status (see the module's note on signals)."""
    if args[:1] in (["-h"], ["--help"]):  # the script's header, then its path: read it for the stages
        lines = SCRIPT.read_text().splitlines()[1:]
        header = [line[2:] for line in lines[:next(i for i, x in enumerate(lines) if not x.startswith("#"))]]
        print("\n".join([*header, "", f"The stages, one line each with their sizes: {SCRIPT}"]))
        return 0
    env = {**os.environ, "PY": sys.executable, "DEMO_ARGS": ""}
    # a Ctrl-C reaches the stage itself (one line saying what was kept, exit 130); not this process
    previous = signal.signal(signal.SIGINT, lambda *_: None)
    try:
        rc = subprocess.call(["bash", str(SCRIPT), *args], env=env)
    finally:
        signal.signal(signal.SIGINT, previous)
    died_of = -rc if rc < 0 else rc - 128 if rc > 128 else 0  # bash: a child killed by signal n exits 128 + n
    if died_of and died_of != signal.SIGINT:
        if died_of != signal.SIGKILL:  # SIGKILL has no handler to reset
            signal.signal(died_of, signal.SIG_DFL)
        os.kill(os.getpid(), died_of)
    return rc
