"""FSDP2 on the CPU: two gloo processes, as `accelerate launch` starts them on two GPUs.

- the finite-weights check of the training stages (training/save.py) on sharded parameters: each
  rank checks its own shard (a DTensor's local tensor) and the verdict is shared by all ranks;
- the rehearsal: ``accelerate launch --config_file configs/accelerate/fsdp.yaml`` (only the CPU's
  override) runs bc (killed and resumed from a sharded checkpoint), one eto-iter with
  full-fine-tuning DPO and precomputed reference log-probs, and eval; the saved policy holds the
  weights the sharded model had when training ended, and DPO began from the BC weights on every
  rank (rank 1 got them by broadcast). Each launched process runs this file's ``__main__``: the
  CLI with the test's recording hooks (FSDP on a CPU: ``distributed.fsdp_on_cpu``);
- the same on DeepSpeed ZeRO-3 (``configs/accelerate/deepspeed_zero3.yaml`` unchanged; DeepSpeed's CPU
  accelerator, gloo): bc, then one eto-iter, on partitioned parameters;
- after a ZeRO-3 trainer, the next rollout's model load is not a DeepSpeed collective.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest


# -- the finite check on FSDP2 shards (torch.distributed.fsdp.fully_shard, gloo) ----------------------
def _finite_check_worker(rank: int, world: int, port: int, out: str) -> None:
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from types import SimpleNamespace

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    from eto_train.training.save import NonFiniteError, finite_guard

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.Linear(6, 4))
    mesh = init_device_mesh("cpu", (world,))
    for layer in model:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    guard, state, seen = finite_guard("bc"), SimpleNamespace(global_step=1), {}
    try:
        guard.on_step_end(None, state, None, model=model)
        seen["clean"] = "passed"
    except Exception as exc:  # noqa: BLE001 - the test reads what each rank saw
        seen["clean"] = f"{type(exc).__name__}: {exc}"
    w = model[1].weight
    seen["sharded"] = type(w).__name__ == "DTensor" and tuple(w.to_local().shape) != tuple(w.shape)
    if rank == 1:  # a NaN in rank 1's shard only: rank 0's shard of that weight is finite
        with torch.no_grad():
            w.to_local()[0, 0] = float("nan")
    try:
        guard.on_step_end(None, state, None, model=model)
        seen["nan"] = "passed"
    except NonFiniteError as exc:
        seen["nan"] = str(exc)
    except Exception as exc:  # noqa: BLE001
        seen["nan"] = f"{type(exc).__name__}: {exc}"
    Path(out, f"rank{rank}.json").write_text(json.dumps(seen))
    dist.destroy_process_group()


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_finite_check_reads_each_ranks_fsdp2_shard_and_all_ranks_stop(tmp_path):
    import torch.multiprocessing as mp

    mp.spawn(_finite_check_worker, args=(2, _free_port(), str(tmp_path)), nprocs=2, join=True)
    seen = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert all(s["sharded"] for s in seen)  # FSDP2 sharded the weights: each rank holds half
    assert [s["clean"] for s in seen] == ["passed", "passed"]
    assert "non-finite weights (NaN/Inf) after optimizer step 1" in seen[0]["nan"]
    assert "on another process" in seen[0]["nan"]      # rank 0's own shard is finite; it stops all the same
    assert "e.g. '1.weight'" in seen[1]["nan"]          # the rank holding the NaN names the weight


def test_a_finished_zero3_trainer_does_not_turn_the_next_rollouts_model_load_into_a_collective():
    """A DeepSpeed Trainer registers its ZeRO-3 config globally; while it is set, transformers builds
    every model inside deepspeed.zero.Init (a collective), so the rollout after eto-iter's DPO hung on
    the main process. Rollouts call free_accelerator_memory before building their engine."""
    from transformers.integrations.deepspeed import is_deepspeed_zero3_enabled, set_hf_deepspeed_config

    from eto_train.distributed import free_accelerator_memory

    class Zero3Config:  # what HfTrainerDeepSpeedConfig answers (the real one needs deepspeed installed)
        def is_zero3(self):
            return True

    config = Zero3Config()  # alive, as a finished trainer's arguments keep it
    set_hf_deepspeed_config(config)
    assert is_deepspeed_zero3_enabled()
    free_accelerator_memory()
    assert not is_deepspeed_zero3_enabled()


# -- the rehearsal: accelerate launch with configs/accelerate/fsdp.yaml on two CPU processes -----------
ROOT = Path(__file__).resolve().parents[1]
# the CPU's one override of the FSDP config: no CUDA (accelerate then picks gloo, accelerate/state.py:
# 801-813); --num_processes 2 on the command line as the Makefile passes it. Everything else, FSDP2,
# full shard, bf16 mixed precision, sharded checkpoints and RAM-efficient loading, is the GPU config's.
CPU_OVERRIDES = {"use_cpu": True}
# DeepSpeed needs none: its CPU accelerator (deepspeed/accelerator/cpu_accelerator.py) and gloo are picked
# without CUDA; use_cpu must stay false, as accelerate drops DeepSpeed when cpu is set (accelerate/state.py:974)
ACCEL_CPU_OVERRIDES = {"fsdp": CPU_OVERRIDES, "deepspeed_zero3": {}}
# the toy run of test_multiprocess.py; the policy saved in bf16 as on a GPU (trained on fp32 masters)
RUN = ["bc.per_device_train_batch_size=2", "+bc.effective_batch=8", "+eto.dpo.effective_batch=4",
       "eto.dpo.precompute_ref_log_probs=true", "model.dtype=bfloat16"]


def _launch(tmp: Path, stage: str, *extra: str, procs: int = 2, env=None, ok: bool = True, accel: str = "fsdp"):
    """``accelerate launch --config_file configs/accelerate/<accel>.yaml`` (with the CPU's overrides, if
    any) of ``stage`` on ``procs`` processes; procs=1: the plain CLI."""
    import subprocess

    from test_pipeline import TOY

    cfg = ROOT / "configs" / "accelerate" / f"{accel}.yaml"
    if ACCEL_CPU_OVERRIDES[accel]:
        cfg, shipped = tmp / f"{accel}_cpu.yaml", cfg
        if not cfg.exists():
            from omegaconf import OmegaConf

            OmegaConf.save(OmegaConf.merge(OmegaConf.load(shipped), ACCEL_CPU_OVERRIDES[accel]), cfg)
    args = [stage, f"paths.runs={tmp / 'runs'}", "run_name=fsdp", *TOY, *RUN, *extra]
    cmd = ([sys.executable, "-m", "eto_train.cli", *args] if procs == 1 else
           [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(cfg), "--num_processes",
            str(procs), "--main_process_port", str(_free_port()), __file__, *args])
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900,
                          env={**os.environ, "OMP_NUM_THREADS": "1", "ETO_TEST_SHARDS": str(tmp / "hooks" / stage),
                               **(env or {})})
    if ok:
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


def _weights(folder: Path) -> dict:
    from safetensors.torch import load_file

    return {k: v for f in sorted(folder.glob("*.safetensors")) for k, v in load_file(f).items()}


def _gathered(hooks: Path, when: str) -> dict:
    """The two ranks' local shards put back together (FSDP2 shards dim 0: rank 0 the first half)."""
    import torch

    r0, r1 = (torch.load(hooks / f"{when}_rank{r}.pt") for r in (0, 1))
    return {n: torch.cat([r0[n], r1[n]]) for n in r0}


def _joined(hooks: Path, when: str, saved: dict) -> dict:
    """ZeRO-3's two flat 1-D partitions put back together: rank 0 holds the first ceil(n/2) elements of
    each weight, rank 1 the rest plus padding (deepspeed/runtime/zero/partition_parameters.py); cut to
    the saved tensor's size and shaped as it."""
    import torch

    r0, r1 = (torch.load(hooks / f"{when}_rank{r}.pt") for r in (0, 1))
    return {n: torch.cat([r0[n], r1[n]])[:saved[n].numel()].view(saved[n].shape) for n in r0}


def _same(gathered: dict, saved: dict) -> list[str]:
    """Names whose gathered shards differ from the saved tensor (compared in the saved dtype)."""
    import torch

    assert set(gathered) <= set(saved), set(gathered) - set(saved)
    return [n for n, t in gathered.items() if not torch.equal(t.to(saved[n].dtype), saved[n])]


def _finite_calls(hooks: Path) -> list[list[list[dict]]]:
    return [[json.loads(x) for x in (hooks / f"finite_rank{r}.jsonl").read_text().splitlines()] for r in (0, 1)]


def test_fsdp2_rehearsal_bc_eto_iteration_eval_on_two_cpu_processes(tmp_path):
    run, hooks = tmp_path / "runs" / "fsdp", tmp_path / "hooks"
    _launch(tmp_path, "experts", procs=1)
    _launch(tmp_path, "model", procs=1)

    # bc, killed after optimizer step 3 (checkpoint-2 written, sharded), then resumed from it
    killed = _launch(tmp_path, "bc", env={"ETO_TRAIN_KILL_AT": "bc:3"}, ok=False)
    assert killed.returncode != 0 and "ETO_TRAIN_KILL_AT=bc:3: SIGKILL" in killed.stdout
    ckpt = run / "bc" / ".next" / "checkpoints" / "checkpoint-2"
    if not ckpt.exists():
        ckpt = run / "bc" / "checkpoints" / "checkpoint-2"
    # SHARDED_STATE_DICT: each rank's model and optimizer shards (DCP), no gathered optimizer state
    assert sorted(p.name for p in ckpt.iterdir() if p.is_dir()) == ["optimizer_0", "pytorch_model_fsdp_0"], \
        sorted(p.name for p in ckpt.iterdir())
    import shutil

    shutil.rmtree(hooks / "bc")
    _launch(tmp_path, "bc")
    bc = json.loads((run / "bc" / "manifest.json").read_text())
    assert bc["status"] == "done" and bc["metrics"]["resumed_from"] == "checkpoint-2"
    assert bc["metrics"]["optimizer_steps"] == 3

    # FSDP2 ran: the finite check read DTensors, each rank its own half, on both ranks, when training
    # began (after the resume) and after step 3
    calls = _finite_calls(hooks / "bc")
    assert [len(c) for c in calls] == [2, 2]
    for c in calls:
        embed = next(p for p in c[0] if p["name"] == "model.embed_tokens.weight")
        assert all(p["type"] == "DTensor" for p in c[0]), c[0]
        assert embed["local"] == [embed["shape"][0] // 2, embed["shape"][1]], embed

    # the saved policy: one plain bf16 checkpoint with the weights the sharded model ended with
    policy = _weights(run / "bc" / "model")
    assert {str(t.dtype) for t in policy.values()} == {"torch.bfloat16"}
    assert json.loads((run / "bc" / "model" / "config.json").read_text())["dtype"] == "bfloat16"
    assert _same(_gathered(hooks / "bc", "end"), policy) == []

    # one ETO iteration: exploration, pairs, full-fine-tuning DPO with precomputed reference log-probs
    it = _launch(tmp_path, "eto-iter")
    dpo = run / "eto" / "iter1" / "dpo"
    assert json.loads((dpo / "manifest.json").read_text())["status"] == "done"
    # the DPO policy began from the BC policy on both ranks: rank 1 built it empty and got rank 0's
    # weights by broadcast (fsdp_cpu_ram_efficient_loading)
    assert _same(_gathered(hooks / "eto-iter", "begin"), policy) == []
    # the reference is the BC policy too: at step 0 policy and reference agree, the sigmoid loss is log 2
    state = json.loads((sorted((dpo / "checkpoints").glob("checkpoint-*"))[-1] / "trainer_state.json").read_text())
    first = next(h for h in state["log_history"] if "loss" in h)
    assert abs(first["loss"] - 0.6931) < 1e-3 and first["rewards/chosen"] == 0, first
    assert "Computing reference log probs" in it.stderr + it.stdout or (dpo / "pairs_dataset").is_dir()
    assert all(len(c) == 3 for c in _finite_calls(hooks / "eto-iter"))  # begin + 2 steps, each rank
    new = _weights(dpo / "model")
    assert _same(_gathered(hooks / "eto-iter", "end"), new) == []
    assert json.loads((run / "eto" / "iter1" / "summary.json").read_text())["pairs"] > 0

    # eval of the new policy on both processes
    _launch(tmp_path, "eval", f"eval.policy={dpo / 'model'}", "eval.tag=fsdp", "eval.splits=[seen]")
    ev = run / "eval" / "fsdp" / "seen"
    assert json.loads((ev / "manifest.json").read_text())["status"] == "done"
    assert len((ev / "episodes.jsonl").read_text().splitlines()) == 4  # 2 seen tasks of each of 2 games
    assert json.loads((ev / "manifest.json").read_text())["data_parallel"] == {"world_size": 2,
                                                                               "played": {"0": 2, "1": 2}}


@pytest.mark.rehearse  # ACCEL=deepspeed_zero3, the second sharding engine: make rehearse (make test runs FSDP2's)

def test_zero3_rehearsal_bc_eto_iteration_on_two_cpu_processes(tmp_path):
    """bc, then one eto-iter (full-fine-tuning DPO, precomputed reference), under DeepSpeed ZeRO-3."""
    run, hooks = tmp_path / "runs" / "fsdp", tmp_path / "hooks"
    # transformers refuses the yaml's bf16 DeepSpeed config when the TrainingArguments have bf16=False
    # (transformers/integrations/deepspeed.py:260); the CPU profiles turn bf16 autocast off
    zero3 = ["bc.bf16=true", "eto.dpo.bf16=true"]
    _launch(tmp_path, "experts", procs=1)
    _launch(tmp_path, "model", procs=1)

    _launch(tmp_path, "bc", *zero3, accel="deepspeed_zero3")
    bc = json.loads((run / "bc" / "manifest.json").read_text())
    assert bc["status"] == "done" and bc["metrics"]["optimizer_steps"] == 3
    # ZeRO-3 ran: the finite check read partitioned parameters (empty, each rank's ds_tensor about half
    # of the weight), on both ranks, when training began and after each of the 3 steps
    calls = _finite_calls(hooks / "bc")
    assert [len(c) for c in calls] == [4, 4]
    for c in calls:
        assert all(p["numel"] == 0 for p in c[0]), c[0]
        embed = next(p for p in c[0] if p["name"] == "model.embed_tokens.weight")
        n = embed["shape"][0] * embed["shape"][1]
        assert embed["local"] == [(n + 1) // 2], embed

    # the saved policy: one plain bf16 checkpoint (gathered by save_model) with the trained weights
    policy = _weights(run / "bc" / "model")
    assert {str(t.dtype) for t in policy.values()} == {"torch.bfloat16"}
    assert _same(_joined(hooks / "bc", "end", policy), policy) == []

    _launch(tmp_path, "eto-iter", *zero3, accel="deepspeed_zero3")
    dpo = run / "eto" / "iter1" / "dpo"
    assert json.loads((dpo / "manifest.json").read_text())["status"] == "done"
    assert all(len(c) == 3 for c in _finite_calls(hooks / "eto-iter"))  # begin + 2 steps, each rank
    assert _same(_joined(hooks / "eto-iter", "begin", policy), policy) == []  # DPO began from BC
    new = _weights(dpo / "model")
    assert _same(_joined(hooks / "eto-iter", "end", new), new) == []
    assert _same(_joined(hooks / "eto-iter", "end", new), policy) != []       # and DPO trained
    assert json.loads((run / "eto" / "iter1" / "summary.json").read_text())["pairs"] > 0


# -- what each process of the rehearsal runs (accelerate launch tests/test_fsdp.py <stage> ...) --------
def record_shards(folder: Path, stage: str) -> None:
    """Test-only hooks, per rank, into ``folder``: every call of the finite check records what it read
    (each parameter's type, full and local shape), its first call (training begins) the rank's local
    shards, and the save the rank's local shards of the trained weights before ``save_policy``
    gathers them; at exit the process's peak host memory (ru_maxrss)."""
    import atexit
    import resource

    import torch

    from eto_train.distributed import rank
    from eto_train.training import save

    folder.mkdir(parents=True, exist_ok=True)
    first, save_policy = save._first_nonfinite, save.save_policy

    from torch.distributed.tensor import DTensor

    def local(p):  # the test's own reading of a shard, not the code's under test (ZeRO-3: the flat partition)
        return p.to_local() if isinstance(p, DTensor) else getattr(p, "ds_tensor", p)

    def shards(model):
        return {n: local(p).detach().cpu().clone() for n, p in model.named_parameters()}

    def first_nonfinite(model):
        seen = [{"name": n, "type": type(p).__name__, "shape": list(getattr(p, "ds_shape", p.shape)),
                 "numel": p.numel(), "local": list(local(p).shape)} for n, p in model.named_parameters()]
        if not (folder / f"finite_rank{rank()}.jsonl").exists():
            torch.save(shards(model), folder / f"begin_rank{rank()}.pt")
        with (folder / f"finite_rank{rank()}.jsonl").open("a") as f:
            f.write(json.dumps(seen) + "\n")
        return first(model)

    def save_policy_recording(trainer, tokenizer, out, *args, **kwargs):
        torch.save(shards(trainer.model), folder / f"end_rank{rank()}.pt")
        return save_policy(trainer, tokenizer, out, *args, **kwargs)

    save._first_nonfinite, save.save_policy = first_nonfinite, save_policy_recording
    atexit.register(lambda: (folder / f"maxrss_{stage}_rank{rank()}.txt").write_text(
        str(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)))  # KiB on Linux


if __name__ == "__main__":
    import runpy

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    record_shards(Path(os.environ["ETO_TEST_SHARDS"]), sys.argv[1])
    sys.argv = ["eto_train.cli", *sys.argv[1:]]
    runpy.run_module("eto_train.cli", run_name="__main__", alter_sys=True)
