"""Two processes as `accelerate launch` starts them on two GPUs (RANK / WORLD_SIZE set by
torchrun), here on the CPU with the gloo backend: bc and one ETO iteration at toy scale.

Training runs data-parallel; so do rollouts: each process plays its share of an exploration or
evaluation and rank 0 merges the shards into the same episode file a single process writes (a
play killed half way resumes from the shards); DPO's precomputed reference log-probs are shared
through one dataset folder. The shard bookkeeping itself is tested at the function level below.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from test_pipeline import ROOT, TOY


def _run(runs: Path, stage: str, procs: int, *extra: str, name: str = "mp", ok: bool = True, env=None):
    launcher = [sys.executable] if procs == 1 else [sys.executable, "-m", "torch.distributed.run",
                                                  "--nproc_per_node", str(procs)]
    cmd = [*launcher, "-m", "eto_train.cli", stage, f"paths.runs={runs}", f"run_name={name}", *TOY,
           "bc.per_device_train_batch_size=2", "+bc.effective_batch=8", "+eto.dpo.effective_batch=4", *extra]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env={**os.environ, **(env or {})})
    if ok:
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:] + _first_errors(proc.stderr)
    return proc


def _first_errors(stderr: str) -> str:
    """The first traceback of each rank in torchrun's output (the tail alone shows the rank that
    was stopped, not the one that failed first)."""
    lines, out = stderr.splitlines(), []
    for i, line in enumerate(lines):
        if "Traceback (most recent call last)" in line:
            block = lines[i:i + 60]
            end = next((j for j, x in enumerate(block[1:], 1) if not re.sub(r"^\[rank\d+\]: ", "", x).startswith((" ", "\t"))),
                       len(block) - 1)
            out.append("\n".join(block[:end + 1]))
    return "\n--- tracebacks, first of each ---\n" + "\n\n".join(dict.fromkeys(out))[:6000] if out else ""


def _episodes(path: Path, tmp: Path) -> list[dict]:
    """The records without wall-clock latencies, with the test's folder as <TMP>."""
    def norm(o):
        if isinstance(o, dict):
            return {k: norm(v) for k, v in o.items() if k not in ("latency_s", "env_s")}
        return [norm(v) for v in o] if isinstance(o, list) else o.replace(str(tmp), "<TMP>") if isinstance(o, str) else o
    return [norm(json.loads(x)) for x in path.read_text().splitlines()]


def _played(stage: Path) -> dict:
    """How many episodes each rank played (the stage manifest's data-parallel record)."""
    return json.loads((stage / "manifest.json").read_text())["data_parallel"]


def test_bc_and_an_eto_iteration_on_two_processes(tmp_path):
    _run(tmp_path, "experts", 1)
    _run(tmp_path, "model", 1)
    _run(tmp_path, "bc", 2)
    run = tmp_path / "mp"
    bc = json.loads((run / "bc" / "manifest.json").read_text())
    # 8 trajectories, effective batch 8 = 2 per process x 2 processes x accumulation 2: one step per epoch
    assert bc["status"] == "done" and bc["metrics"]["optimizer_steps"] == 3 and bc["metrics"]["trajectories"] == 8
    assert sorted(p.name for p in (run / "bc" / "model").glob("*.safetensors")) == ["model.safetensors"]
    assert not (run / "bc" / "model" / "training_args.bin").exists()

    # the iteration is killed in its exploration, after each process's second episode (ETO_TRAIN_KILL_AT
    # reaches both; torchrun stops the other one), then run again: it resumes from the shards
    it = run / "eto" / "iter1"
    killed = _run(tmp_path, "eto-iter", 2, ok=False, env={"ETO_TRAIN_KILL_AT": "explore/iter1:2"})
    assert killed.returncode != 0 and json.loads((it / "explore" / "manifest.json").read_text())["status"] == "running"
    assert list((it / "explore" / "shards").glob("rank*.jsonl"))
    proc = _run(tmp_path, "eto-iter", 2)
    # both ranks played exploration episodes: each was killed at its 2nd of 3 tasks at the latest (rank 0's
    # kill may stop rank 1 before it printed its share), so each has some left for the rerun
    assert "[explore/iter1] rank 1 of 2: playing" in killed.stdout + proc.stdout
    explore_played = _played(it / "explore")
    assert explore_played["world_size"] == 2 and sorted(explore_played["played"]) == ["0", "1"]
    assert all(n > 0 for n in explore_played["played"].values()), explore_played
    assert re.search(r"\[explore/iter1\]resuming:\d+episodesalreadyrecorded,\d+togo\(\d+ofthemfromtheshards",
                     "".join(proc.stdout.split())), proc.stdout[-3000:]
    explored = (it / "explore" / "episodes.jsonl").read_text().splitlines()
    assert len(explored) == 3 * 2  # eto.explore.tasks_per_game=3 of 2 games, each played once, by one process
    assert sorted(p.name for p in (it / "explore").iterdir()) == ["episodes.jsonl", "manifest.json"]
    # the dev evaluation, too, ran on both processes
    assert "[eval/iter1/dev] rank 1 of 2: playing 1 of 2 episodes" in proc.stdout
    assert _played(it / "eval" / "dev") == {"world_size": 2, "played": {"0": 1, "1": 1}}
    summary = json.loads((it / "summary.json").read_text())
    assert summary["pairs"] > 0 and (it / "dpo" / "model" / "model.safetensors").exists()
    assert json.loads((it / "dpo" / "manifest.json").read_text())["status"] == "done"
    assert summary["dev"]["episodes"] == 2

    # one process, BC on the training tasks (greedy, as the exploration): the same episodes, in the same
    # order, as the two processes' merged (and resumed) exploration
    _run(tmp_path, "eval", 1, "eval.splits=[train]", f"eval.policy={run / 'bc' / 'model'}", name="one")
    one = _episodes(tmp_path / "one" / "eval" / "bc" / "train" / "episodes.jsonl", tmp_path)
    two = _episodes(it / "explore" / "episodes.jsonl", tmp_path)
    assert [e for e in one if e["episode_id"] in {e["episode_id"] for e in two}] == two and len(one) == 8


# -- the shard bookkeeping, without processes ---------------------------------------------------------
def _lines(ids) -> str:
    return "".join(json.dumps({"episode_id": k, "status": "success"}) + "\n" for k in ids)


def test_tasks_are_dealt_whole_round_robin_in_work_order():
    from eto_train.rollouts.play import deal

    keys, tasks = ["k0", "k1", "k2", "k3", "k4", "k5"], ["a", "a", "b", "c", "b", "d"]
    assert deal(keys, tasks, 2) == [["k0", "k1", "k3"], ["k2", "k4", "k5"]]
    assert deal(keys, tasks, 1) == [keys]
    assert deal(keys, tasks, 5) == [["k0", "k1"], ["k2", "k4"], ["k3"], ["k5"], []]


def test_shards_of_a_killed_play_are_folded_in_once_in_work_order(tmp_path):
    from eto_train.rollouts.play import fold_shards

    keys = [f"k{i}" for i in range(6)]
    file, shards = tmp_path / "episodes.jsonl", tmp_path / "shards"
    shards.mkdir()
    file.write_text(_lines(["k3"]))
    (shards / "rank0.jsonl").write_text(_lines(["k4", "k0"]) + '{"episode_id": "k1", "sta')  # cut by the kill
    (shards / "rank1.jsonl").write_text(_lines(["k3", "zz", "k2"]))  # k3 twice; zz: not in this work list
    (shards / "rank2.jsonl").write_text(_lines(["k5"]))  # a rank of an earlier run with 3 processes
    (shards / "plan.json").write_text("{}")
    with pytest.warns(UserWarning, match="partial last line"):
        assert fold_shards(file, keys) == 4
    assert [json.loads(x)["episode_id"] for x in file.read_text().splitlines()] == ["k0", "k2", "k3", "k4", "k5"]
    assert sorted(p.name for p in shards.iterdir()) == ["plan.json"]  # the episodes are in the file now
    before = file.read_bytes()
    assert fold_shards(file, keys) == 0 and fold_shards(file, keys, order=True) == 0
    assert file.read_bytes() == before
    file.write_text(_lines(["k5", "k1"]))  # a single process's play, in the order episodes ended
    fold_shards(file, keys, order=True)
    assert [json.loads(x)["episode_id"] for x in file.read_text().splitlines()] == ["k1", "k5"]


def test_rank_0_names_a_failed_or_silent_rank(tmp_path):
    from eto_train.rollouts.play import wait_for_shards

    plan, faults = {"id": "p1", "world_size": 3}, {"injected_faults": 1, "timeout": 1}
    for r in (0, 1):
        (tmp_path / f"rank{r}.done").write_text(json.dumps({"plan": "p1", "faults": faults}))
    (tmp_path / "rank2.done").write_text(json.dumps({"plan": "p0", "faults": faults}))  # a killed run's
    with pytest.raises(TimeoutError, match=r"\[eval/x\] rank\(s\) \[2\] did not finish their share"):
        wait_for_shards("eval/x", tmp_path, plan, timeout_s=0.2, poll_s=0.05)
    (tmp_path / "rank2.failed").write_text(json.dumps({"plan": "p1", "error": "ValueError: boom"}))
    with pytest.raises(RuntimeError, match=r"\[eval/x\] rank 2: failed with ValueError: boom"):
        wait_for_shards("eval/x", tmp_path, plan, timeout_s=60, poll_s=0.05)
    (tmp_path / "rank2.failed").unlink()
    (tmp_path / "rank2.done").write_text(json.dumps({"plan": "p1", "faults": faults}))
    assert wait_for_shards("eval/x", tmp_path, plan, timeout_s=60) == {"injected_faults": 3, "timeout": 3}


def test_rank_0_names_a_rank_whose_heartbeat_stopped_and_waits_for_one_that_beats(tmp_path, monkeypatch):
    """Issue 37, item 6: a rank killed (or its machine lost) while playing its share left rank 0 waiting
    SHARD_WAIT_S (30 min) for a marker that never came. Its heartbeat stops: rank 0 names it, what it
    kept and how to resume after the silence; a rank that beats is waited for."""
    import threading

    from eto_train.rollouts.play import Heartbeat, wait_for_shards

    plan = {"id": "p1", "world_size": 2}
    (tmp_path / "rank0.done").write_text(json.dumps({"plan": "p1", "faults": {"timeout": 0}}))
    (tmp_path / "rank1.jsonl").write_text(_lines(["k1"]))
    (tmp_path / "rank1.alive").write_text(json.dumps({"plan": "p1", "rank": 1, "pid": 4242, "host": "m1", "beat": 7}))
    with pytest.raises(RuntimeError, match=r"\[eval/x\] rank 1 \(pid 4242 on m1\) stopped: no sign of life for \d+ s "
                                           r"\(its heartbeat .*rank1.alive stopped at beat 7: a killed process or a lost "
                                           r"machine\); its 1 recorded episode\(s\) are kept in .*rank1.jsonl\. The stage is "
                                           r"not done .* run the same command again, on every machine"):
        wait_for_shards("eval/x", tmp_path, plan, timeout_s=60, poll_s=0.05, silence_s=0.3)
    (tmp_path / "rank1.alive").unlink()
    monkeypatch.setenv("ETO_TRAIN_RANK_SILENCE_S", "2")  # a beat every 0.5 s
    beat = Heartbeat(tmp_path, plan)
    beat.path = tmp_path / "rank1.alive"  # as rank 1 would write it
    done = threading.Timer(3.0, lambda: (tmp_path / "rank1.done").write_text(
        json.dumps({"plan": "p1", "faults": {"timeout": 1}})))
    with beat:
        done.start()
        assert wait_for_shards("eval/x", tmp_path, plan, timeout_s=60, poll_s=0.05) == {"timeout": 1}
    assert json.loads((tmp_path / "rank1.alive").read_text())["beat"] >= 4


def test_a_plan_left_by_a_killed_run_is_not_taken(tmp_path, monkeypatch):
    import time

    from eto_train.manifest import Stage
    from eto_train.rollouts.play import wait_for_plan

    monkeypatch.setenv("WORLD_SIZE", "2")
    stage = Stage("eval/x", tmp_path / "seen", {"a": 1})
    started = time.time()
    stale = {"config_hash": "c1", "world_size": 2, "written_at": started - 5, "id": "old"}
    (tmp_path / "seen" / "shards").mkdir(parents=True)
    (tmp_path / "seen" / "shards" / "plan.json").write_text(json.dumps(stale))
    with pytest.raises(TimeoutError):
        wait_for_plan(stage, "c1", since=started, poll_s=0.05, timeout_s=0.2)
    (tmp_path / "seen" / ".next" / "shards").mkdir(parents=True)  # a rerun of a finished stage
    fresh = {**stale, "written_at": started + 1, "id": "new"}
    (tmp_path / "seen" / ".next" / "shards" / "plan.json").write_text(json.dumps(fresh))
    assert wait_for_plan(stage, "c1", since=started, poll_s=0.05)["id"] == "new"
    assert wait_for_plan(stage, "c1", since=started - 10, poll_s=0.05)["id"] == "new"  # the newest
    monkeypatch.setenv("WORLD_SIZE", "3")  # another number of processes: not this launch's plan
    with pytest.raises(TimeoutError):
        wait_for_plan(stage, "c1", since=started, poll_s=0.05, timeout_s=0.2)
    (tmp_path / "seen" / "manifest.json").write_text(json.dumps({"status": "done", "config_hash": "c1"}))
    assert wait_for_plan(stage, "c1", since=started, poll_s=0.05) is None  # done meanwhile (a shared copy)


def test_each_ranks_vllm_engine_is_built_on_its_own_gpu(monkeypatch):
    import torch

    from eto_train.rollouts.vllm_engine import own_gpu

    devices = []
    monkeypatch.setattr(torch.cuda, "set_device", devices.append)
    for k, v in {"WORLD_SIZE": "2", "RANK": "1", "LOCAL_RANK": "1", "MASTER_PORT": "29500",
                 "CUDA_VISIBLE_DEVICES": "4,5"}.items():
        monkeypatch.setenv(k, v)
    with own_gpu():
        seen = {k: os.environ.get(k) for k in ("CUDA_VISIBLE_DEVICES", "RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_PORT")}
    assert seen == {"CUDA_VISIBLE_DEVICES": "5", "RANK": None, "LOCAL_RANK": None, "WORLD_SIZE": None,
                    "MASTER_PORT": None}
    assert devices == [1] and os.environ["CUDA_VISIBLE_DEVICES"] == "4,5" and os.environ["RANK"] == "1"
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    with own_gpu():
        assert os.environ["CUDA_VISIBLE_DEVICES"] == "1"
    assert "CUDA_VISIBLE_DEVICES" not in os.environ
