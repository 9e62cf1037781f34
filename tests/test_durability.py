"""Nothing written is lost: check before touching, done means whole, one writer per stage.

On a finished toy run (experts, tiny model, 3 BC steps, BC on `seen`, all in this process):

- a rerun that fails (a bad setting, an experts file cut short, a NaN checkpoint, an incomplete
  play, a NaN during training) fails before long work, names the key or the file, and leaves a
  finished stage's files byte for byte as they were, its manifest still "done";
- a rerun of a finished stage with another config works aside (``.next``) and swaps in only a
  whole result; a swap cut by a kill is completed by the next run;
- a rollout stage is done only when every item of its work list has its episode;
- two evaluations of the same tag at once (two processes) never record an episode twice;
- files are written with the process's umask, not 0600.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from test_pipeline import ROOT, TOY

from eto_train.locks import StageLocked, lock_path
from eto_train.manifest import NEXT, Stage


def _compose(overrides: list[str]):
    """configs/config.yaml composed with ``overrides`` and typed once (config.load): what a stage takes."""
    from hydra import compose, initialize_config_dir

    from eto_train.config import load

    with initialize_config_dir(str(ROOT / "configs"), version_base="1.3", job_name="durability"):
        return load(compose("config", overrides=overrides))


def files(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder`` (hidden ones too), by relative path: a byte-for-byte snapshot.

    Identity sidecars (``.identity.json``: a cache of content hashes, never part of any hash, that
    a check of a stage's inputs or outputs may write; see store.identity_sha256) are left out."""
    from eto_train.store import is_identity_file

    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file() and not is_identity_file(p.name)}


def manifest(folder: Path) -> dict:
    return json.loads((folder / "manifest.json").read_text())


def finished_toy_run(runs: Path) -> tuple[Path, list[str]]:
    """Experts, model, bc and BC's evaluation on `seen` (4 episodes) in ``runs/toy``; the run folder
    and the overrides that made it."""
    from eto_train.stages import bc, evaluate, experts, model

    overrides = [*TOY, f"paths.runs={runs}", "run_name=toy", "eval.splits=[seen]"]
    cfg = _compose(overrides)
    experts.run(cfg)
    model.run(cfg)
    bc.run(cfg)
    evaluate.run(cfg)
    return runs / "toy", overrides


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    """A finished toy run: experts, model, bc and BC's evaluation on `seen` (4 episodes)."""
    runs = tmp_path_factory.mktemp("runs")
    run, overrides = finished_toy_run(runs)
    assert manifest(run / "bc")["status"] == "done" and manifest(run / "eval" / "bc" / "seen")["status"] == "done"
    return {"runs": runs, "run": run, "overrides": overrides}


def _no_rollouts(monkeypatch):
    """Make any rollout a test failure: the error must come before the long work."""
    from eto_train.rollouts import play

    def boom(*a, **k):
        raise AssertionError("rollouts started: the error should have come before")

    monkeypatch.setattr(play, "run_rollouts", boom)


def test_eval_rerun_with_a_bad_setting_fails_before_touching_the_finished_episodes(toy, monkeypatch):
    from eto_train.stages.evaluate import evaluate_policy

    seen = toy["run"] / "eval" / "bc" / "seen"
    before = files(seen)
    _no_rollouts(monkeypatch)
    with pytest.raises(ValueError, match=r"rollout.backend='hff'"):  # before any rollout (_no_rollouts)
        evaluate_policy(_compose(toy["overrides"] + ["rollout.backend=hff"]), str(toy["run"] / "bc" / "model"), "bc",
                        ["seen"], seen.parent)
    assert files(seen) == before and manifest(seen)["status"] == "done"
    assert not lock_path(seen).exists()  # released on the way out


def test_rerun_of_a_finished_eval_replaces_it_only_once_whole_and_resumes_aside(toy, monkeypatch, capsys):
    from eto_train.rollouts import play
    from eto_train.stages.evaluate import evaluate_policy

    root = toy["run"] / "eval" / "aside"
    policy = str(toy["run"] / "bc" / "model")
    cfg = _compose(toy["overrides"])
    evaluate_policy(cfg, policy, "aside", ["seen"], root)
    seen = root / "seen"
    finished = files(seen)

    # another generation setting: the rerun plays into .next and dies after one episode
    real = play.run_rollouts

    def dies_after_one(todo, *a, on_episode, **k):
        def once(ep):
            on_episode(ep)
            raise RuntimeError("killed")
        real(todo[:1], *a, on_episode=once, **k)

    monkeypatch.setattr(play, "run_rollouts", dies_after_one)
    cfg6 = _compose(toy["overrides"] + ["rollout.generation.max_new_tokens=5"])
    with pytest.raises(RuntimeError, match="killed"):
        evaluate_policy(cfg6, policy, "aside", ["seen"], root)
    assert files(seen) == {**finished, **{k: v for k, v in files(seen).items() if k.startswith(NEXT)}}
    assert {k for k in files(seen) if not k.startswith(NEXT)} == set(finished)  # the finished ones, untouched
    assert manifest(seen)["status"] == "done" and len((seen / NEXT / "episodes.jsonl").read_text().splitlines()) == 1

    # the same rerun again: resumes in .next, then swaps the whole new result in
    monkeypatch.setattr(play, "run_rollouts", real)
    capsys.readouterr()
    res = evaluate_policy(cfg6, policy, "aside", ["seen"], root)
    assert "resuming: 1 episodes already recorded, 3 to go" in "".join(capsys.readouterr().out.split("\n"))
    assert not (seen / NEXT).exists() and not (seen / ".old").exists()
    m = manifest(seen)
    assert m["status"] == "done" and m["config"]["sampling"]["max_new_tokens"] == 5
    ids = [json.loads(x)["episode_id"] for x in (seen / "episodes.jsonl").read_text().splitlines()]
    assert len(ids) == len(set(ids)) == 4 and res["seen"]["overall"]["episodes"] == 4
    assert json.loads((seen / "metrics.json").read_text())["policy"] == m["policy"]


def test_experts_cut_short_then_bc_fails_and_the_finished_bc_is_kept(toy, monkeypatch, capsys):
    from eto_train.records import RecordError
    from eto_train.stages import bc

    run, cfg = toy["run"], _compose(toy["overrides"])
    experts = run / "experts" / "train.jsonl"
    whole, before = experts.read_bytes(), files(run / "bc")
    experts.write_bytes(whole[:-40])  # the last line cut
    monkeypatch.setattr(bc.recipe, "train", lambda *a, **k: pytest.fail("bc trained on a file it had not read whole"))
    try:
        # the experts stage recorded its file when it finished: bc names the cut and who rebuilds it
        # before it reads a line (tests/test_damaged_outputs.py: and that rerun rebuilds it)
        with pytest.raises(RecordError, match=rf"input 'experts' is damaged: {experts}: \d+ bytes when finished, "
                                              rf"now \d+ \(cut short\)\. Re-run `make experts`"):
            bc.run(cfg)
        assert files(run / "bc") == before and manifest(run / "bc")["status"] == "done"
    finally:
        experts.write_bytes(whole)
    capsys.readouterr()
    bc.run(cfg)  # the identical file again: BC is up to date, nothing retrained or deleted
    assert "[bc] up to date" in capsys.readouterr().out
    assert files(run / "bc") == before


def test_eval_with_batch_size_0_on_an_interrupted_eval_and_an_incomplete_play_are_never_done(toy, monkeypatch, capsys):
    from eto_train.rollouts import play
    from eto_train.stages.evaluate import evaluate_policy

    root, policy = toy["run"] / "eval" / "cut", str(toy["run"] / "bc" / "model")
    real = play.run_rollouts

    def plays_only(n):
        def partial(todo, *a, **k):
            real(todo[:n], *a, **k)
        return partial

    # an evaluation interrupted after 2 of its 4 episodes (the engine stopped; manifest "running")
    monkeypatch.setattr(play, "run_rollouts", plays_only(2))
    with pytest.raises(RuntimeError, match=r"\[eval/cut/seen\] incomplete: 2 of 4 work items .* not marked done"):
        evaluate_policy(_compose(toy["overrides"]), policy, "cut", ["seen"], root)
    seen = root / "seen"
    partial = files(seen)
    assert manifest(seen)["status"] == "running" and len((seen / "episodes.jsonl").read_text().splitlines()) == 2

    # batch size 0: a clear error naming the key, before anything is played or written
    _no_rollouts(monkeypatch)
    with pytest.raises(ValueError, match=r"rollout.batch_size=0"):
        evaluate_policy(_compose(toy["overrides"] + ["rollout.batch_size=0"]), policy, "cut", ["seen"], root)
    assert files(seen) == partial

    # an engine that returns having played nothing: not done either
    monkeypatch.setattr(play, "run_rollouts", plays_only(0))
    with pytest.raises(RuntimeError, match=r"incomplete: 2 of 4"):
        evaluate_policy(_compose(toy["overrides"]), policy, "cut", ["seen"], root)
    assert manifest(seen)["status"] == "running"
    assert (seen / "episodes.jsonl").read_bytes() == partial["episodes.jsonl"]

    monkeypatch.setattr(play, "run_rollouts", real)
    capsys.readouterr()
    evaluate_policy(_compose(toy["overrides"]), policy, "cut", ["seen"], root)
    assert "resuming: 2 episodes already recorded, 2 to go" in capsys.readouterr().out
    ids = [json.loads(x)["episode_id"] for x in (seen / "episodes.jsonl").read_text().splitlines()]
    assert len(ids) == len(set(ids)) == 4 and manifest(seen)["status"] == "done"


def test_a_nan_checkpoint_is_refused_before_rollouts(toy, monkeypatch, tmp_path):
    import torch
    from safetensors.torch import load_file, save_file

    from eto_train.rollouts import play
    from eto_train.stages.evaluate import evaluate_policy
    from eto_train.training.save import NonFiniteError

    nan = tmp_path / "nan_model"
    shutil.copytree(toy["run"] / "bc" / "model", nan)
    weights = load_file(str(nan / "model.safetensors"))
    name = sorted(weights)[0]
    weights[name] = weights[name].clone()
    weights[name].view(-1)[0] = float("nan")
    save_file(weights, str(nan / "model.safetensors"), metadata={"format": "pt"})
    _no_rollouts(monkeypatch)
    monkeypatch.setattr(play, "make_policy", lambda *a, **k: pytest.fail("a NaN policy was loaded to play"))
    seen = toy["run"] / "eval" / "bc" / "seen"  # over BC's finished evaluation, under its tag
    before = files(seen)
    with pytest.raises(NonFiniteError, match=rf"{nan}/model.safetensors: weight '{name}' has 1 non-finite"):
        evaluate_policy(_compose(toy["overrides"]), str(nan), "bc", ["seen"], seen.parent)
    assert files(seen) == before and manifest(seen)["status"] == "done" and not lock_path(seen).exists()
    assert torch.isnan(load_file(str(nan / "model.safetensors"))[name]).any()


def test_a_nan_during_training_stops_bc_naming_stage_and_step_and_keeps_the_finished_bc(toy, monkeypatch):
    from eto_train.stages import bc
    from eto_train.training.save import NonFiniteError

    run = toy["run"]
    before = files(run / "bc")
    with pytest.raises(NonFiniteError, match=r"\[bc\] non-finite weights \(NaN/Inf\) after optimizer step \d"):
        bc.run(_compose(toy["overrides"] + ["bc.learning_rate=1e39"]))  # Adam steps of 1e39 overflow float32
    assert {k: v for k, v in files(run / "bc").items() if not k.startswith(NEXT)} == before
    assert manifest(run / "bc")["status"] == "done" and manifest(run / "bc" / NEXT)["status"] == "running"
    assert not list((run / "bc" / NEXT).glob("checkpoints/checkpoint-*/model.safetensors"))  # nothing NaN saved


def test_two_evaluations_of_the_same_tag_at_once_never_record_an_episode_twice(toy, tmp_path):
    runs = toy["runs"]
    overrides = [o for o in toy["overrides"] if not o.startswith("env.splits.seen.count=")]
    cmd = [sys.executable, "-m", "eto_train.cli", "eval", *overrides, "eval.tag=twin",
           "env.splits.seen.count=5"]  # 10 episodes
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("ETO_TRAIN_KILL_AT", None)
    logs = [tmp_path / f"eval{i}.log" for i in range(2)]
    procs = []
    for log in logs:
        with open(log, "w") as fh:
            procs.append(subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=fh, stderr=subprocess.STDOUT))
    outs = [(p.wait(timeout=300), log.read_text(errors="replace")) for p, log in zip(procs, logs)]
    seen = runs / "toy" / "eval" / "twin" / "seen"
    ids = [json.loads(x)["episode_id"] for x in (seen / "episodes.jsonl").read_text().splitlines()]
    assert len(ids) == len(set(ids)) == 10, "an episode recorded twice (or one missing)"
    assert manifest(seen)["status"] == "done" and not lock_path(seen).exists()
    # each either played it, found it done, or stopped at once on the other's lock
    for rc, out in outs:
        assert rc == 0 or ("StageLocked" in out and "is being written by another process (pid" in out), out[-3000:]
    assert any(rc == 0 for rc, _ in outs)


# -- the Stage itself (no model) ---------------------------------------------------------------

HOLDER = """
import sys, time
from eto_train.manifest import Stage
s = Stage("eval/x/seen", sys.argv[1], {"a": 1}, outputs=["episodes.jsonl"])
assert not s.done()
print("holding", flush=True)
time.sleep(120)
"""


def test_a_second_writer_fails_clearly_and_a_dead_holders_lock_is_stale(tmp_path):
    d = tmp_path / "eval" / "x" / "seen"
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(d)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "holding"
        info = json.loads(lock_path(d).read_text())
        assert info["pid"] == holder.pid and info["host"] and info["started_at"]
        with pytest.raises(StageLocked, match=rf"\[eval/x/seen\] {d} is being written by another process "
                                              rf"\(pid {holder.pid} on "):
            Stage("eval/x/seen", d, {"a": 1}, outputs=["episodes.jsonl"]).done()
        assert not d.exists()  # the second writer touched nothing
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    assert lock_path(d).exists()  # a SIGKILL leaves the file: stale, its holder is dead
    s = Stage("eval/x/seen", d, {"a": 1}, outputs=["episodes.jsonl"])
    assert not s.done() and json.loads(lock_path(d).read_text())["pid"] == os.getpid()
    s.begin()
    s.finish()
    assert not lock_path(d).exists()


def _finished(d: Path, config: dict, text: str) -> Stage:
    s = Stage("toy", d, config, outputs=["out.txt", "ckpt"])
    assert not s.done()
    s.begin()
    (s.work / "out.txt").write_text(text)
    (s.work / "ckpt").mkdir(exist_ok=True)
    (s.work / "ckpt" / "w").write_text(text)
    return s


def test_a_swap_cut_by_a_kill_is_completed_by_the_next_run(tmp_path, monkeypatch, capsys):
    d = tmp_path / "stage"
    _finished(d, {"v": 1}, "one").finish()
    first = files(d)
    s = _finished(d, {"v": 2}, "two")
    assert s.work == d / NEXT and manifest(d)["config"] == {"v": 1}
    assert {k: v for k, v in files(d).items() if not k.startswith(NEXT)} == first  # untouched until finish
    real, calls = os.rename, []

    def cut(src, dst):  # the kill: after the first old output went to .old
        calls.append(src)
        if len(calls) > 1:
            raise KeyboardInterrupt
        real(src, dst)

    monkeypatch.setattr(os, "rename", cut)
    with pytest.raises(KeyboardInterrupt):
        s.finish()
    monkeypatch.setattr(os, "rename", real)
    s.release()
    assert Stage("toy", d, {"v": 2}, outputs=["out.txt", "ckpt"]).done()  # rolled forward: the new result
    assert (d / "out.txt").read_text() == (d / "ckpt" / "w").read_text() == "two"
    assert not (d / NEXT).exists() and not (d / ".old").exists() and manifest(d)["config"] == {"v": 2}


def test_files_get_the_umask_permissions_not_0600(tmp_path):
    from eto_train.store import append_jsonl, write_atomic, write_json

    old = os.umask(0o022)
    try:
        write_atomic(tmp_path / "a.txt", "x")
        _finished(tmp_path / "stage", {"v": 1}, "one").finish()
        append_jsonl(tmp_path / "e.jsonl", [{"a": 1}])
        os.umask(0o002)
        write_json(tmp_path / "b.json", {})
    finally:
        os.umask(old)
    mode = lambda p: (tmp_path / p).stat().st_mode & 0o777  # noqa: E731
    assert mode("a.txt") == mode("stage/manifest.json") == mode("e.jsonl") == 0o644
    assert mode("b.json") == 0o664
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []


def test_a_checkpoint_that_safetensors_writes_0600_is_readable_once_its_stage_is_done(tmp_path):
    import torch
    from safetensors.torch import save_file

    from eto_train.manifest import Stage

    old = os.umask(0o022)
    try:
        s = Stage("toy", tmp_path / "stage", {"v": 1}, outputs=["model"])
        s.begin()
        (s.work / "model").mkdir(parents=True)
        save_file({"w": torch.zeros(2)}, str(s.work / "model" / "model.safetensors"))
        (s.work / "model" / "kept.bin").write_bytes(b"x")
        (s.work / "model" / "kept.bin").chmod(0o640)  # set on purpose: left alone
        assert (s.work / "model" / "model.safetensors").stat().st_mode & 0o777 == 0o600  # what the library does
        s.finish()
    finally:
        os.umask(old)
    model = tmp_path / "stage" / "model"
    assert (model / "model.safetensors").stat().st_mode & 0o777 == 0o644
    assert (model / "kept.bin").stat().st_mode & 0o777 == 0o640
