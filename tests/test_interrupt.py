"""Ctrl-C (issue "Nothing written is lost", part 1): a SIGINT stops a script quietly.

A real evaluation at toy size gets a Ctrl-C mid-rollout (SIGINT to its whole process group, as a
terminal sends it): it exits with status 130 and one line saying how many episodes it kept and
where, without a traceback from py4j, the JVM or a worker thread; the evaluation run again
resumes and ends with the episodes of an uninterrupted run (the reference and the rerun are
played in this process, through the same stage code, to spare two start-ups of torch and Hydra).
Then the pieces: the rollout loop stops at once (no retry, no new simulator) and closes every
environment, the simulator JVMs do not receive the terminal's SIGINT, and the line names what
each kind of stage kept.
"""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from eto_train import interrupt
from eto_train.envs import EnvironmentFailure, StepResult, Task
from eto_train.records import PolicyRef
from eto_train.rollouts.loop import run_rollouts
from fixture_settings import react_prompt, rollout_config

ROOT = Path(__file__).resolve().parents[1]
# 10 seeds of `seen` x 2 games, played one at a time: once 2 are recorded, 18 remain, a window the Ctrl-C below lands in
# on a loaded box too (with 12 played 2 at a time, the last ones could be written before it arrived)
EPISODES = 20
EVAL = ["run_name=toy", "env.step_limit=4", "env.splits.seen.count=10", "eval.splits=[seen]", "rollout.batch_size=1",
        "rollout.generation.max_new_tokens=4", "wandb.enabled=false", "runtime.rollout_threads=1"]
LINE = re.compile(r"interrupted: (\d+) of (\d+) episodes of eval/bc/seen kept in (\S+); "
                  r"rerun the same command to resume")


def _evaluate(runs: Path, policy: Path, log: Path) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("ETO_TRAIN_KILL_AT", None)
    cmd = [sys.executable, "-m", "eto_train.cli", "eval", f"paths.runs={runs}", f"eval.policy={policy}", *EVAL]
    with open(log, "w") as out:  # a file, not a pipe: stdout and stderr in the order written
        return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)


def _finish(proc: subprocess.Popen, timeout: float = 180) -> int:
    try:
        return proc.wait(timeout=timeout)
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _records(path: Path, run: Path) -> dict[str, dict]:
    out = {}
    for line in path.read_text().splitlines():
        e = json.loads(line)
        for st in e["steps"]:
            st.pop("latency_s")  # wall-clock times: never the same twice
            st.pop("env_s", None)
        out[e["episode_id"]] = json.loads(json.dumps(e).replace(str(run), "<RUN>"))
    return out


def _evaluate_here(runs: Path, policy: Path) -> Path:
    """The same evaluation, played in this process (no second start-up of torch and Hydra to pay)."""
    from hydra import compose, initialize_config_dir

    from eto_train.config import load
    from eto_train.stages import evaluate

    with initialize_config_dir(config_dir=str(ROOT / "configs"), version_base="1.3"):
        cfg = load(compose("config", overrides=[f"paths.runs={runs}", f"eval.policy={policy}", *EVAL]))
    evaluate.run(cfg)
    return runs / "toy" / "eval" / "bc" / "seen" / "episodes.jsonl"


def test_ctrl_c_during_evaluation_keeps_the_episodes_says_so_and_a_rerun_resumes(tiny_model_dir, tmp_path, capsys):
    runs = tmp_path / "interrupted"
    proc = _evaluate(runs, tiny_model_dir, tmp_path / "interrupted.log")
    file = runs / "toy" / "eval" / "bc" / "seen" / "episodes.jsonl"

    def ctrl_c() -> None:  # mid-rollout: once 2 of the 20 episodes are recorded
        deadline = time.monotonic() + 150
        while proc.poll() is None and time.monotonic() < deadline:
            if file.exists() and file.read_bytes().count(b"\n") >= 2:
                os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C at a terminal: the whole foreground process group
                return
            time.sleep(0.02)

    sender = threading.Thread(target=ctrl_c)
    sender.start()
    want_file = _evaluate_here(tmp_path / "reference", tiny_model_dir)  # uninterrupted, while the other starts up
    sender.join()
    rc = _finish(proc, timeout=60)
    out = (tmp_path / "interrupted.log").read_text(errors="replace")
    assert rc == 130, out[-3000:]
    said = [line for line in out.splitlines() if "interrupted" in line]
    assert len(said) == 1, out[-3000:]
    m = LINE.fullmatch(said[0].strip())
    assert m, said[0]
    kept = int(m.group(1))
    assert int(m.group(2)) == EPISODES and Path(m.group(3)) == file
    assert 2 <= kept < EPISODES and file.read_bytes().count(b"\n") == kept  # the line counts what the file holds
    for noise in ("Traceback", "py4j", "Py4J", "Error", "Exception", "java"):
        assert noise not in out, out[-3000:]

    capsys.readouterr()
    assert _evaluate_here(runs, tiny_model_dir) == file  # the same evaluation again (its stage code, in this process)
    out = capsys.readouterr().out
    assert "".join(f"[eval/bc/seen] resuming: {kept} episodes already recorded, {EPISODES - kept} to go".split()) \
        in "".join(out.split())
    want = _records(want_file, tmp_path / "reference" / "toy")
    got = _records(file, runs / "toy")
    assert len(got) == len(want) == EPISODES and file.read_bytes().count(b"\n") == EPISODES  # none twice
    assert got == want


# -- the pieces ------------------------------------------------------------------------------
class _DyingEnv:
    """A game whose simulator dies under the Ctrl-C: the interrupt comes with the 4th step (the
    second of the second episode in play), and every call after it fails as a call to a stopped
    JVM would."""

    name, version = "dying", "dying-1"
    made: list["_DyingEnv"] = []
    steps = 0

    def __init__(self):
        self.closed = False
        _DyingEnv.made.append(self)

    def max_steps(self, task):
        return 3

    def action_forms(self, game):
        return ["go"]

    def reset(self, task):
        if interrupt.interrupted():
            raise EnvironmentFailure("JVM gone")
        return "Go.", StepResult("start", 0.0, False, False, valid_actions=["go"])

    def step(self, action):
        _DyingEnv.steps += 1
        if _DyingEnv.steps == 4:
            interrupt._INTERRUPTED.set()  # what the SIGINT handler does
        if interrupt.interrupted():
            raise EnvironmentFailure("Answer from Java side is empty")
        return StepResult("moved", 0.0, False, False, valid_actions=["go"])

    def close(self):
        self.closed = True


class _Go:
    def generate(self, convs):
        return [("Action: go", 5, 2, 0) for _ in convs]


@pytest.fixture
def interrupt_state(monkeypatch):
    """Undo what an interrupt leaves in this process (the flag, the hooks, py4j's log levels)."""
    monkeypatch.setattr(threading, "excepthook", threading.excepthook)
    monkeypatch.setattr(sys, "unraisablehook", sys.unraisablehook)
    levels = {n: logging.getLogger(n).level for n in ["py4j", *logging.root.manager.loggerDict] if n.startswith("py4j")}
    handler = signal.getsignal(signal.SIGINT)
    yield
    interrupt._INTERRUPTED.clear()
    interrupt._said.clear()
    signal.signal(signal.SIGINT, handler)
    for n, level in levels.items():
        logging.getLogger(n).setLevel(level)
    logging.disable(logging.NOTSET)


@pytest.mark.parametrize("overlap", [False, True])
def test_an_interrupted_rollout_stops_at_once_and_closes_every_environment(interrupt_state, overlap):
    _DyingEnv.made, _DyingEnv.steps = [], 0
    work = [(Task("dying", "g", "train", s, "seen"), 0) for s in range(4)]
    done = []
    with pytest.raises(KeyboardInterrupt):
        run_rollouts(work, _DyingEnv, _Go(), PolicyRef(id="go@0"), react_prompt(),
                     rollout_config(batch_size=2, env_retries=3, overlap_env=overlap), on_episode=done.append)
    # no retry, no fresh simulator for the failed call, no episode recorded as an environment failure
    assert len(_DyingEnv.made) == 2 and all(e.closed for e in _DyingEnv.made)
    assert done == []


def test_the_simulator_jvm_does_not_get_the_terminals_ctrl_c(twx_cfg):
    from eto_train.envs import make_env
    from eto_train.envs.textworld_express import _SharedJVM

    env = make_env(twx_cfg)
    try:
        jvm = _SharedJVM._host._gateway.java_process
        assert os.getpgid(jvm.pid) != os.getpgid(0)  # its own process group: Python stops it
    finally:
        env.close()


def _stage(folder: Path, name: str, status: str = "running", **config) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "manifest.json").write_text(json.dumps({"stage": name, "status": status, "config": config}))


def _interrupt_in(cfg, capsys) -> str:
    with pytest.raises(SystemExit) as stop:
        with interrupt.interruptible(cfg):
            raise KeyboardInterrupt
    assert stop.value.code == 130
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    interrupt._said.clear()  # the next call is another process's interrupt
    return err.strip()


def test_the_line_names_what_the_running_stage_kept(interrupt_state, tmp_path, capsys):
    from omegaconf import OmegaConf

    run = tmp_path / "run"
    cfg = OmegaConf.create({"paths": {"run": str(run), "base": str(run)}})
    assert _interrupt_in(cfg, capsys) == ("interrupted: finished stages and episodes recorded so far are kept; "
                                          "rerun the same command to resume")  # nothing written yet
    run.mkdir()
    assert _interrupt_in(cfg, capsys) == (f"interrupted: finished stages and episodes recorded so far are kept "
                                          f"in {run}; rerun the same command to resume")
    _stage(run / "experts", "experts", status="done")  # finished: not what was interrupted
    _stage(run / "bc", "bc")
    assert _interrupt_in(cfg, capsys) == ("interrupted: bc stopped (nothing of it is saved yet; stages finished "
                                          "before it are kept); rerun the same command to resume")
    for step in (2, 10, 12):
        (run / "bc" / "checkpoints" / f"checkpoint-{step}").mkdir(parents=True)
        if step < 12:  # checkpoint-12: a save cut short (no trainer_state.json, written last)
            (run / "bc" / "checkpoints" / f"checkpoint-{step}" / "trainer_state.json").write_text("{}")
    assert _interrupt_in(cfg, capsys) == (f"interrupted: bc stopped; its checkpoints up to checkpoint-10 are kept "
                                          f"in {run / 'bc' / 'checkpoints'}; rerun the same command to resume")
    time.sleep(0.05)
    _stage(run / "eto" / "iter1" / "explore", "explore/iter1", episodes=6)  # the newest running stage
    # issue 37, trial row 9: stopped before its first episode (no episodes.jsonl, no shard): no file is claimed
    explored = run / "eto/iter1/explore/episodes.jsonl"
    assert _interrupt_in(cfg, capsys) == (
        f"interrupted: explore/iter1 stopped before its first episode was recorded (no {explored} yet: nothing of it "
        f"to keep; stages finished before it are kept); rerun the same command to resume")
    (run / "eto" / "iter1" / "explore" / "shards").mkdir()
    (run / "eto" / "iter1" / "explore" / "shards" / "rank1.jsonl").write_text('{"a": 0}\n')  # a rank's first episode
    assert _interrupt_in(cfg, capsys) == (
        f"interrupted: 1 of 6 episodes of explore/iter1 kept in {explored} and {run / 'eto/iter1/explore/shards'}; "
        f"rerun the same command to resume")
    (run / "eto" / "iter1" / "explore" / "shards" / "rank1.jsonl").unlink()
    (run / "eto" / "iter1" / "explore" / "episodes.jsonl").write_text('{"a": 1}\n{"a": 2}\n{"a"')  # a cut last line
    assert _interrupt_in(cfg, capsys) == (
        f"interrupted: 2 of 6 episodes of explore/iter1 kept in {run / 'eto/iter1/explore/episodes.jsonl'}; "
        f"rerun the same command to resume")


def test_an_error_raised_by_the_interrupt_counts_as_the_interrupt_and_other_errors_pass(interrupt_state, capsys):
    with pytest.raises(ValueError):
        with interrupt.interruptible(None):
            raise ValueError("a real error, before any Ctrl-C")
    assert capsys.readouterr().err == ""
    with pytest.raises(SystemExit) as stop, interrupt.interruptible():  # the start-up guard around the script's
        with interrupt.interruptible(None, resume=False):
            interrupt._INTERRUPTED.set()
            raise EnvironmentFailure("TextWorldExpress step failed: Answer from Java side is empty")
    assert stop.value.code == 130
    assert capsys.readouterr().err == "interrupted; rerun the same command to start again\n"  # one line
