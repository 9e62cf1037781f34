"""Durable, reproducible runs at toy scale (issue 5, criteria 1 and 4).

1. The toy demo is SIGKILLed inside bc, eval, explore and dpo (one kill per command, at a
   deterministic point set by ``ETO_TRAIN_KILL_AT``, see ``eto_train.killpoints``) and the same
   command is run again after each kill; the finished run equals an uninterrupted one: the same
   episodes (none duplicated, none missing), the same pairs files byte for byte, the same
   trained weights and the same metrics.
2. Two uninterrupted runs with the same seed in two folders give byte-identical pairs files
   and identical metrics.

Only what is by nature not reproducible is left out of the comparison: each step's
``latency_s`` (wall-clock time) and the run folder's absolute path (replaced by ``<RUN>``).
"""

from __future__ import annotations

import hashlib
import json
import signal
from pathlib import Path

import pytest
from background import Background, eto_train, one_thread_env
from test_pipeline import TOY

from eto_train.training.resume import resume_checkpoint

# bc saves at step 2 of 3 and DPO after each of its 2 steps: a kill inside either has a checkpoint to resume from
_SET = ["bc.max_steps=3", "bc.save_steps=2", "eto.dpo.max_steps=2", "eto.dpo.save_steps=1", "eto.iterations=1"]
DEMO = [o for o in TOY if o.split("=")[0] not in {x.split("=")[0] for x in _SET}] + _SET


class Demo(Background):
    """The toy demo in the background (tests/background.py)."""

    def __init__(self, runs: Path, log: Path, kill_at: str | None = None):
        self.run_dir = runs / "toy"
        super().__init__(eto_train("demo", f"paths.runs={runs}", "run_name=toy", *DEMO), log, one_thread_env(kill_at),
                         timeout=600)


def demo(runs: Path, log: Path, kill_at: str | None = None) -> tuple[int, str]:
    return Demo(runs, log, kill_at).wait()


def _squash(text: str) -> str:
    return "".join(text.split())  # rich wraps and folds long lines


def _lines(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()]


def _norm(obj, run: str):
    """The record without wall-clock latencies, with the run folder as <RUN>."""
    if isinstance(obj, dict):
        return {k: _norm(v, run) for k, v in obj.items() if k not in ("latency_s", "env_s")}
    if isinstance(obj, list):
        return [_norm(v, run) for v in obj]
    if isinstance(obj, str):
        return obj.replace(run, "<RUN>")
    return obj


def snapshot(run_dir: Path) -> dict[str, dict]:
    """Everything two equivalent runs must share, keyed by path in the run folder."""
    run = str(run_dir)
    rel = lambda p: str(p.relative_to(run_dir))
    snap: dict[str, dict] = {"pairs": {}, "episodes": {}, "metrics": {}, "weights": {}}
    for p in sorted(run_dir.rglob("pairs.jsonl")):
        snap["pairs"][rel(p)] = p.read_bytes()
    for p in sorted(run_dir.rglob("episodes.jsonl")):
        snap["episodes"][rel(p)] = [_norm(e, run) for e in _lines(p)]
    for p in sorted([*run_dir.rglob("metrics.json"), *run_dir.rglob("stats.json"), run_dir / "eto" / "result.json",
                     run_dir / "compare" / "compare.json", run_dir / "report.json"]):
        snap["metrics"][rel(p)] = _norm(json.loads(p.read_text()), run)
    for p in sorted(run_dir.rglob("model.safetensors")):
        if "checkpoint-" not in str(p):
            snap["weights"][rel(p)] = hashlib.sha256(p.read_bytes()).hexdigest()
    return snap


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """Two uninterrupted toy demos with the same seed in two folders, started at once in the
    background (the kill points are deterministic, so the tests may run alongside them)."""
    runs = [tmp_path_factory.mktemp(name) for name in ("reference", "twin")]
    demos = [Demo(r, r / "demo.log") for r in runs]
    done: dict[int, Path] = {}

    def get(i: int) -> Path:
        if i not in done:
            rc, out = demos[i].wait()
            assert rc == 0, out[-4000:]
            done[i] = demos[i].run_dir
        return done[i]

    yield get
    for d in demos:
        d.stop()


def test_sigkill_inside_bc_eval_explore_dpo_then_rerun_equals_uninterrupted_run(uninterrupted, tmp_path):
    run = tmp_path / "toy"
    # (kill point, what the rerun of the same command must say when it resumes the killed stage)
    kills = [
        ("bc:3", "[bc] resuming from the last checkpoint {run}/bc/checkpoints/checkpoint-2"),  # killed after step 3
        ("eval/bc/seen:2", "[eval/bc/seen] resuming: 2 episodes already recorded, 2 to go"),
        ("explore/iter1:3", "[explore/iter1] resuming: 3 episodes already recorded, 3 to go"),
        ("dpo/iter1:2", "[dpo/iter1] resuming from the last checkpoint {run}/eto/iter1/dpo/checkpoints/checkpoint-1"),
    ]
    # the same command again after each kill; it carries the next kill point, later in the pipeline
    outputs = []
    for i, (point, _) in enumerate(kills):
        rc, out = demo(tmp_path, tmp_path / f"kill{i}.log", kill_at=point)
        assert rc == -signal.SIGKILL, f"{point}: exit {rc}\n{out[-4000:]}"
        assert f"ETO_TRAIN_KILL_AT={point}: SIGKILL" in out
        outputs.append(out)
        # the kill left its stage unfinished, with partial work to resume
        if point == "bc:3":
            assert json.loads((run / "bc" / "manifest.json").read_text())["status"] == "running"
            ckpts = run / "bc" / "checkpoints"
            assert sorted(p.name for p in ckpts.glob("checkpoint-*")) == ["checkpoint-2"]
            # and as if the kill had come in the middle of saving step 3: a half-written checkpoint
            (ckpts / "checkpoint-3").mkdir()
            (ckpts / "checkpoint-3" / "model.safetensors").write_bytes(
                (ckpts / "checkpoint-2" / "model.safetensors").read_bytes()[:1000])
        elif point == "eval/bc/seen:2":
            assert len(_lines(run / "eval" / "bc" / "seen" / "episodes.jsonl")) == 2
        elif point == "explore/iter1:3":
            assert len(_lines(run / "eto" / "iter1" / "explore" / "episodes.jsonl")) == 3
        elif point == "dpo/iter1:2":
            ckpts = sorted(p.name for p in (run / "eto" / "iter1" / "dpo" / "checkpoints").glob("checkpoint-*"))
            assert ckpts == ["checkpoint-1"]
            assert json.loads((run / "eto" / "iter1" / "dpo" / "manifest.json").read_text())["status"] == "running"
    rc, out = demo(tmp_path, tmp_path / "final.log")
    assert rc == 0, out[-4000:]
    outputs.append(out)
    # every rerun resumed the stage killed just before it (instead of starting it over)
    for i, (point, message) in enumerate(kills):
        assert _squash(message.format(run=run)) in _squash(outputs[i + 1]), \
            f"the rerun after the kill at {point} did not resume it"
    assert "checkpoint-3: incomplete checkpoint" in outputs[1]  # the half-written one was set aside
    assert "up to date" in outputs[-1]

    got, want = snapshot(run), snapshot(uninterrupted(0))
    # no episode duplicated or missing, in every episode file
    assert set(got["episodes"]) == set(want["episodes"])
    for f, eps in got["episodes"].items():
        ids = [e["episode_id"] for e in eps]
        assert len(ids) == len(set(ids)), f"{f}: duplicated episodes"
        assert sorted(ids) == sorted(e["episode_id"] for e in want["episodes"][f]), f"{f}: episodes differ"
        by_id = {e["episode_id"]: e for e in want["episodes"][f]}
        assert all(e == by_id[e["episode_id"]] for e in eps), f"{f}: an episode's content differs"
    # training resumed from checkpoints reproduces the uninterrupted weights exactly
    assert got["weights"] == want["weights"] and len(want["weights"]) >= 6
    assert got["pairs"] == want["pairs"] and got["pairs"]
    assert got["metrics"] == want["metrics"]
    for stage, ckpt in (("bc", "checkpoint-2"), ("eto/iter1/dpo", "checkpoint-1")):
        m = json.loads((run / stage / "manifest.json").read_text())
        assert m["status"] == "done" and m["metrics"]["resumed_from"] == ckpt
        assert "resumed_from" not in json.loads((uninterrupted(0) / stage / "manifest.json").read_text())["metrics"]


def test_two_runs_with_the_same_seed_give_identical_pairs_and_metrics(uninterrupted):
    got, want = snapshot(uninterrupted(1)), snapshot(uninterrupted(0))
    assert {"eto/iter1/pairs/pairs.jsonl", "compare/trajectory/pairs/pairs.jsonl", "compare/step/pairs/pairs.jsonl",
            "compare/mixture/pairs/pairs.jsonl"} <= set(want["pairs"])
    for f, data in want["pairs"].items():
        assert got["pairs"].get(f) == data, f"{f}: pairs files differ"
    assert got["metrics"] == want["metrics"]
    assert got["episodes"] == want["episodes"]  # the same records, in the same order
    assert got["weights"] == want["weights"]


def test_resume_checkpoint_skips_a_half_written_one_and_drops_another_configs(tmp_path):
    for step, complete in ((1, True), (3, True), (5, False)):
        (tmp_path / f"checkpoint-{step}").mkdir()
        if complete:
            (tmp_path / f"checkpoint-{step}" / "trainer_state.json").write_text("{}")
    with pytest.warns(UserWarning, match="checkpoint-5: incomplete checkpoint"):
        assert resume_checkpoint(tmp_path, resumable=True) == str(tmp_path / "checkpoint-3")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint-1", "checkpoint-3"]
    assert resume_checkpoint(tmp_path, resumable=False) is None and not tmp_path.exists()
    assert resume_checkpoint(tmp_path, resumable=True) is None


def _trainer_like_checkpoint(folder: Path, step: int) -> Path:
    """A checkpoint-<step> holding what the Trainer writes: weights, optimizer, scheduler, RNG state
    (numpy's among them, as Trainer._save_rng_state), trainer_state.json last."""
    import random

    import numpy as np
    import torch
    from safetensors.torch import save_file

    ckpt = folder / f"checkpoint-{step}"
    ckpt.mkdir(parents=True)
    model = torch.nn.Linear(4, 3)
    opt = torch.optim.AdamW(model.parameters())
    model(torch.ones(2, 4)).sum().backward()
    opt.step()
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(ckpt / "model.safetensors"))
    torch.save(opt.state_dict(), ckpt / "optimizer.pt")
    torch.save(sched.state_dict(), ckpt / "scheduler.pt")
    torch.save({"python": random.getstate(), "numpy": np.random.get_state(), "cpu": torch.random.get_rng_state()},
               ckpt / "rng_state.pth")
    (ckpt / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    return ckpt


def test_a_damaged_checkpoint_is_named_set_aside_and_the_one_before_resumed(tmp_path, capsys):
    """Issue 37, trial row 4: a killed bc whose last checkpoint has a corrupt optimizer.pt (cut to
    1,000 bytes) or an rng_state.pth that torch.load(weights_only=True) refuses stopped every rerun in
    the Trainer's load. It is now named, set aside (not deleted), and the one before is resumed; when
    none loads, training starts over."""
    import datetime

    import torch

    from eto_train.training.resume import SET_ASIDE, checkpoint_problem

    stage = tmp_path / "bc"
    ckpts = stage / "checkpoints"
    for step in (2, 4, 6):
        _trainer_like_checkpoint(ckpts, step)
    assert all(checkpoint_problem(ckpts / f"checkpoint-{s}") is None for s in (2, 4, 6))  # whole ones pass
    opt = ckpts / "checkpoint-6" / "optimizer.pt"
    opt.write_bytes(opt.read_bytes()[:1000])
    cut = opt.read_bytes()
    assert resume_checkpoint(ckpts, resumable=True, name="bc") == str(ckpts / "checkpoint-4")
    err = capsys.readouterr().err
    aside = stage / SET_ASIDE
    assert err.startswith(f"[bc] 1 checkpoint(s) in {ckpts} cannot be resumed: checkpoint-6: optimizer.pt: ")
    assert "zip archive" in err and f"set aside (not deleted) as {aside / 'checkpoint-6'}" in err
    assert "So resuming from checkpoint-4, the newest checkpoint that loads" in err and len(err.splitlines()) == 1
    assert sorted(p.name for p in ckpts.iterdir()) == ["checkpoint-2", "checkpoint-4"]
    assert (aside / "checkpoint-6" / "optimizer.pt").read_bytes() == cut  # kept as it was
    # an RNG state the weights-only unpickler refuses (a global it does not allow), in both that are left
    for step in (2, 4):
        torch.save({"python": None, "when": datetime.date(2026, 1, 1)}, ckpts / f"checkpoint-{step}" / "rng_state.pth")
    assert resume_checkpoint(ckpts, resumable=True, name="bc") is None
    err = capsys.readouterr().err
    assert "2 checkpoint(s)" in err and "checkpoint-4: rng_state.pth: Weights only load failed" in err
    assert "training starts from the beginning: no earlier checkpoint loads" in err
    assert sorted(p.name for p in aside.iterdir()) == ["checkpoint-2", "checkpoint-4", "checkpoint-6"]
    assert list(ckpts.iterdir()) == []
    # a second damaged checkpoint-6 later: a name of its own, nothing overwritten
    _trainer_like_checkpoint(ckpts, 6)
    (ckpts / "checkpoint-6" / "trainer_state.json").write_text("{cut")
    assert resume_checkpoint(ckpts, resumable=True, name="bc") is None
    assert "checkpoint-6: trainer_state.json: " in capsys.readouterr().err
    assert len([p for p in aside.iterdir() if p.name.startswith("checkpoint-6")]) == 2
