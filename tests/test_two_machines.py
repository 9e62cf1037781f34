"""Two machines, one run folder (issue 37, item 6): the README's two-node command, here as two
"machines" on 127.0.0.1.

Each machine is one ``accelerate launch --config_file configs/accelerate/fsdp.yaml --num_machines 2
--machine_rank <0|1> --main_process_ip 127.0.0.1 --num_processes 2`` of one gloo process (FSDP2 on the
CPU: the config's ``use_cpu`` override, and ``mixed_precision: no`` so that everything is fp32), both
writing one shared run folder, through bc -> eto-iter -> eval. Each process is its machine's "local
main" (LOCAL_RANK 0); global rank 1 is machine 1's. What is checked:

- exactly one writer per file: every file the two machines create or write in the run folder (traced
  with ``strace -ff``: open for writing, creat, rename's target, link, truncate) is written by one
  machine only, and machine 1 writes nothing but its own: its shards of a play (``shards/rank1.*``),
  its shards of a Trainer checkpoint (``rng_state_1.pth``, ``__1_*.distcp``) and its own log folder
  (``logs/<time>-<stage>-rank1``). It used to write the pairs file, the iteration's summary and
  DPO's dataset caches beside rank 0, and TRL's maps let it, as a local main, write caches of its own;
- the locks are held across machines: while the two machines evaluate, a third command on the same
  stage stops with StageLocked naming rank 0's process;
- a SIGKILL of machine 1's process mid-eval (after its first episode) is named by rank 0 within
  ETO_TRAIN_RANK_SILENCE_S (its heartbeat stopped), exit non-zero, what both ranks recorded kept; the
  same command again on both machines resumes and finishes;
- the evaluation's episodes equal, record for record (latencies aside), one process's evaluation of
  the same policy (fp32, greedy).

Marked ``rehearse`` (make rehearse, not make test): four to five minutes on the project's 2-core box,
where the two machines, their launchers and strace share the two cores through seven launches.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from background import Background, one_thread_env
from test_pipeline import ROOT, TOY

pytestmark = pytest.mark.rehearse

RUN = "two"
DP = ["bc.per_device_train_batch_size=2", "+bc.effective_batch=8", "+eto.dpo.effective_batch=4"]
EVAL = ["eval.splits=[seen]", "env.splits.seen.count=3", "rollout.batch_size=1"]  # 6 episodes, one at a time
SILENCE_S = 15  # ETO_TRAIN_RANK_SILENCE_S: rank 0 names a rank whose heartbeat stopped this long


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _accelerate_config(tmp: Path) -> Path:
    from omegaconf import OmegaConf

    cfg = tmp / "fsdp_cpu.yaml"
    if not cfg.exists():
        OmegaConf.save(OmegaConf.merge(OmegaConf.load(ROOT / "configs" / "accelerate" / "fsdp.yaml"),
                                       {"use_cpu": True, "mixed_precision": "no"}), cfg)
    return cfg


def _args(tmp: Path, stage: str, *extra: str, name: str = RUN) -> list[str]:
    return [stage, f"paths.runs={tmp / 'runs'}", f"run_name={name}", *TOY, *DP, *extra]


def _syscalls() -> list[str]:
    """The calls that create or write a file, those this machine's strace knows (aarch64 has no open, creat,
    rename, link or symlink: only their *at forms)."""
    calls = ["openat", "open", "creat", "rename", "renameat", "renameat2", "link", "linkat", "symlink", "symlinkat",
             "truncate"]
    return [c for c in calls if subprocess.run(["strace", "-qq", "-e", f"trace={c}", "-o", os.devnull, "true"],
                                               capture_output=True).returncode == 0]


class Machine(Background):
    """One machine of two: ``accelerate launch --num_machines 2 --machine_rank <rank>`` of one process,
    in the background (tests/background.py), traced by ``strace -ff`` (one file per process) into ``trace``."""

    def __init__(self, tmp: Path, rank: int, port: int, trace: Path, stage: str, *extra: str, env=None):
        trace.mkdir(parents=True, exist_ok=True)
        launch = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(_accelerate_config(tmp)),
                  "--num_machines", "2", "--machine_rank", str(rank), "--main_process_ip", "127.0.0.1",
                  "--main_process_port", str(port), "--num_processes", "2", "-m", "eto_train.cli",
                  *_args(tmp, stage, *extra)]
        strace = ["strace", "-ff", "-qq", "-e", "trace=" + ",".join(_syscalls()), "-o", str(trace / "t")]
        super().__init__([*strace, *launch], trace.parent / f"{trace.name}.log",
                         one_thread_env(**{"ETO_TRAIN_RANK_SILENCE_S": str(SILENCE_S), **(env or {})}), timeout=900)


def _two(tmp: Path, stage: str, *extra: str, env1=None, during=None) -> list[tuple[int, str]]:
    """``stage`` on both machines at once; ``during()``: run while they do. Returns each (rc, output)."""
    port, n = _free_port(), len(list((tmp / "trace").glob(f"{stage}-*-m0")))
    machines = [Machine(tmp, r, port, tmp / "trace" / f"{stage}-{n}-m{r}", stage, *extra,
                        env=env1 if r == 1 else None) for r in (1, 0)][::-1]
    if during is not None:
        during()
    return [m.wait() for m in machines]


def _one(tmp: Path, stage: str, *extra: str, name: str = RUN) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "eto_train.cli", *_args(tmp, stage, *extra, name=name)], cwd=ROOT,
                          capture_output=True, text=True, timeout=600,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})


# -- who wrote what: strace's lines, successful calls only ------------------------------------------------
_CALL = re.compile(r'^(\w+)\((.*)\)\s+=\s+(-?\d+)')
_STRING = re.compile(r'"((?:[^"\\]|\\.)*)"')


def _written(trace: Path, root: Path) -> set[str]:
    """The files under ``root`` that the processes traced in ``trace`` created or wrote (open with
    O_WRONLY/O_RDWR/O_CREAT, creat, the target of rename/link, truncate), relative to ``root``."""
    out = set()
    for f in trace.glob("t.*"):
        for line in f.read_text(errors="replace").splitlines():
            m = _CALL.match(line)
            if not m or int(m.group(3)) < 0:
                continue
            call, args = m.group(1), m.group(2)
            paths = _STRING.findall(args)
            if not paths:
                continue
            if call in ("openat", "open"):
                if not re.search(r"O_WRONLY|O_RDWR|O_CREAT", args):
                    continue
                target = paths[0]
            elif call in ("rename", "renameat", "renameat2", "link", "linkat", "symlink", "symlinkat"):
                target = paths[-1]
            else:  # creat, truncate
                target = paths[0]
            p = Path(target)
            if p.is_absolute() and (p == root or root in p.parents):
                out.add(str(p.relative_to(root)))
    return out


# machine 1's own files: its shards of a play and of a Trainer checkpoint, its log folder, the writability probe
RANK1_OWN = re.compile(r"(.*/shards/\.?rank1\.(jsonl|done|failed|alive)(\.\d+\.[0-9a-f]+\.tmp)?"
                       r"|.*/checkpoints/checkpoint-\d+/rng_state_1\.pth"
                       r"|.*/checkpoints/checkpoint-\d+/(pytorch_model_fsdp_0|optimizer_0)/__1_\d+\.distcp"
                       r"|logs/\d{8}-\d{6}-\w+-rank1(-\d+)?/.*)")


def _check_one_writer_per_file(tmp: Path, stage_trace: str) -> None:
    root = tmp / "runs" / RUN
    m0, m1 = (_written(tmp / "trace" / f"{stage_trace}-m{r}", root) for r in (0, 1))
    assert m0, f"{stage_trace}: nothing traced on machine 0"
    assert not m0 & m1, f"{stage_trace}: written by both machines: {sorted(m0 & m1)}"
    foreign = sorted(p for p in m1 if not RANK1_OWN.fullmatch(p))
    assert not foreign, f"{stage_trace}: machine 1 (rank 1, its machine's local main) wrote shared files: {foreign}"
    assert any("rank1" in p for p in m1), f"{stage_trace}: machine 1 wrote nothing of its own: {sorted(m1)}"


def _records(path: Path, runs: Path) -> list[dict]:
    out = []
    for line in path.read_text().splitlines():
        e = json.loads(line)
        for st in e["steps"]:
            st.pop("latency_s")
        out.append(json.loads(json.dumps(e).replace(str(runs / RUN), "<RUN>").replace(str(runs / "one"), "<RUN>")))
    return out


def test_two_machines_one_run_folder_bc_eto_iter_eval(tmp_path):
    if shutil.which("strace") is None:
        pytest.skip("strace(1) is needed to see which machine writes which file")
    runs, run = tmp_path / "runs", tmp_path / "runs" / RUN
    for stage in ("experts", "model"):  # one process, as the README's two-node run finds them
        proc = _one(tmp_path, stage)
        assert proc.returncode == 0, proc.stderr[-3000:]

    # -- bc on two machines --------------------------------------------------------------------------------
    (rc0, out0), (rc1, out1) = _two(tmp_path, "bc")
    assert rc0 == 0 and rc1 == 0, out0[-3000:] + out1[-3000:]
    bc = json.loads((run / "bc" / "manifest.json").read_text())
    assert bc["status"] == "done" and bc["metrics"]["optimizer_steps"] == 3
    _check_one_writer_per_file(tmp_path, "bc-0")
    logs = sorted(p.name for p in (run / "logs").iterdir())
    assert any(n.endswith("-bc") for n in logs) and any(n.endswith("-bc-rank1") for n in logs), logs

    # -- one ETO iteration on two machines: explore, pairs, DPO (precomputed reference), dev eval ------------
    (rc0, out0), (rc1, out1) = _two(tmp_path, "eto-iter", "eto.dpo.precompute_ref_log_probs=true")
    assert rc0 == 0 and rc1 == 0, out0[-3000:] + out1[-3000:]
    it = run / "eto" / "iter1"
    summary = json.loads((it / "summary.json").read_text())
    assert summary["pairs"] > 0 and json.loads((it / "dpo" / "manifest.json").read_text())["status"] == "done"
    assert "[explore/iter1] rank 1 of 2: playing" in out1 and "[eval/iter1/dev] rank 1 of 2: playing" in out1
    _check_one_writer_per_file(tmp_path, "eto-iter-0")
    from eto_train.training.save import check_policy

    check_policy(it / "dpo" / "model")

    # -- eval on two machines; machine 1 SIGKILLed after its first episode ---------------------------------
    lock = run / "eval" / "bc" / ".seen.lock"
    third = {}

    def a_third_command_meanwhile():
        t0 = time.time()
        while not lock.exists() and time.time() - t0 < 300:
            time.sleep(0.2)
        holder = json.loads(lock.read_text())
        third["proc"], third["holder"] = _one(tmp_path, "eval", *EVAL), holder

    (rc0, out0), (rc1, out1) = _two(tmp_path, "eval", *EVAL, env1={"ETO_TRAIN_KILL_AT": "eval/bc/seen:1"},
                                    during=a_third_command_meanwhile)
    # the lock of the stage is rank 0's, and a third command on the same stage stops at once, naming it
    assert third["holder"]["stage"] == "eval/bc/seen"
    assert third["proc"].returncode == 2, third["proc"].stderr[-2000:]
    assert "StageLocked" in third["proc"].stderr and f"pid {third['holder']['pid']} on " in third["proc"].stderr
    # machine 1 died by SIGKILL; rank 0 names it and what was kept, and stops (the stage is not done)
    assert "ETO_TRAIN_KILL_AT=eval/bc/seen:1: SIGKILL" in out1 and rc1 != 0
    assert rc0 != 0, out0[-3000:]
    seen = run / "eval" / "bc" / "seen"
    flat = " ".join(out0.split())
    assert (f"eto-train eval: [eval/bc/seen] rank 1 (pid " in flat and "stopped: no sign of life for" in flat
            and "a killed process or a lost machine); its 1 recorded episode(s) are kept in "
                f"{seen / 'shards' / 'rank1.jsonl'}" in flat
            and "run the same command again, on every machine, to play what is missing" in flat), out0[-3000:]
    assert json.loads((seen / "manifest.json").read_text())["status"] == "running"
    assert (seen / "shards" / "rank1.jsonl").read_text().count("\n") == 1

    # -- the same command again on both machines: resumed, finished ----------------------------------------
    (rc0, out0), (rc1, out1) = _two(tmp_path, "eval", *EVAL)
    assert rc0 == 0 and rc1 == 0, out0[-3000:] + out1[-3000:]
    assert re.search(r"\[eval/bc/seen\] resuming: \d+ episodes already recorded", out0), out0[-3000:]
    assert json.loads((seen / "manifest.json").read_text())["status"] == "done"
    _check_one_writer_per_file(tmp_path, "eval-0")
    _check_one_writer_per_file(tmp_path, "eval-1")

    # -- one process, the same policy: the same episodes (fp32, greedy) --------------------------------------
    proc = _one(tmp_path, "eval", *EVAL, f"eval.policy={run / 'bc' / 'model'}", name="one")
    assert proc.returncode == 0, proc.stderr[-3000:]
    one = _records(runs / "one" / "eval" / "bc" / "seen" / "episodes.jsonl", runs)
    two = _records(seen / "episodes.jsonl", runs)
    assert len(two) == 6 and two == one
