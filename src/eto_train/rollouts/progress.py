"""One progress bar per rollout: episodes done / total, steps per second, elapsed time and ETA.

Every rollout backend (HF ``generate``, the KV-cached engine, vLLM) is driven by
:func:`eto_train.rollouts.loop.run_rollouts`, which reports to a :class:`RolloutProgress`: one episode
each time a finished episode has been handed on (recorded), and the number of rows of each
batched step (every row is one step of its episode). Episodes resumed from a killed run count
as done from the start; the speed and the ETA are those of this play alone.

A live bar is drawn only when the console is a terminal; elsewhere (CI, tests, a log file)
nothing is printed. The bar only reads counts: it changes no episode, no order and no file.
"""

from __future__ import annotations

from datetime import timedelta

from rich.console import Console
from rich.progress import (BarColumn, MofNCompleteColumn, Progress, ProgressColumn, Task, TextColumn,
                           TimeElapsedColumn)
from rich.text import Text


class _StepsPerSecond(ProgressColumn):
    """Episode steps (one per row of a batched step) per second of this play."""

    def render(self, task: Task) -> Text:
        elapsed = task.elapsed or 0.0
        rate = task.fields.get("steps", 0) / elapsed if elapsed > 0 else 0.0
        return Text(f"{rate:.1f} steps/s", style="progress.data.speed")


class _Eta(ProgressColumn):
    """Time left at this play's mean pace so far (episodes resumed from an earlier run left out:
    they took no time here)."""

    def render(self, task: Task) -> Text:
        played = task.completed - task.fields.get("resumed", 0)
        if task.total is not None and task.completed >= task.total:
            left = "0:00:00"
        elif played <= 0 or not task.elapsed or task.total is None:
            left = "-:--:--"
        else:
            left = str(timedelta(seconds=int((task.total - task.completed) * task.elapsed / played)))
        return Text(f"eta {left}", style="progress.remaining")


class RolloutProgress:
    """``with RolloutProgress("explore iter1", total=40, done=8) as bar: run_rollouts(..., progress=bar)``.

    ``done``: episodes already recorded (a resumed play). ``draw=False`` never draws (a rank of a
    data-parallel play other than the main one: several live bars on one terminal garble it).
    """

    def __init__(self, label: str, total: int, done: int = 0, console: Console | None = None, draw: bool = True):
        self.label, self.total, self.done, self.steps = label, total, done, 0
        self.console = console if console is not None else Console()
        self.live = draw and self.console.is_terminal
        self._bar: Progress | None = None
        self._task = None

    def __enter__(self) -> RolloutProgress:
        if self.live:
            # the bar takes what the text leaves of the line (at most 40), so that the line does not wrap
            width = max(10, min(40, self.console.width - len(self.label) - len(str(self.total)) * 2 - 56))
            self._bar = Progress(TextColumn("{task.description}", markup=False), BarColumn(bar_width=width),
                                 MofNCompleteColumn(), TextColumn("episodes"), _StepsPerSecond(),
                                 TimeElapsedColumn(), TextColumn("elapsed"), _Eta(), console=self.console,
                                 refresh_per_second=4)
            self._task = self._bar.add_task(self.label, total=self.total, completed=self.done, steps=0,
                                            resumed=self.done)
            self._bar.start()
        return self

    def episode_done(self) -> None:
        self.done += 1
        if self._bar is not None:
            self._bar.update(self._task, completed=self.done)

    def steps_done(self, n: int) -> None:
        self.steps += n
        if self._bar is not None:
            self._bar.update(self._task, steps=self.steps)

    def __exit__(self, *exc) -> None:
        if self._bar is not None:
            self._bar.stop_task(self._task)  # the elapsed time and the speed stop here
            self._bar.stop()  # the final state stays on screen
            self._bar = None
