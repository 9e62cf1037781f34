"""SIGKILL inside a trainer's save of its policy, then the same command again (issue 26, item 7).

The kill points ``<stage>/save:1`` (weights and config written, no tokenizer yet) and
``<stage>/save:2`` (everything written, not yet checked) are in training/save.py (see
``eto_train.killpoints``). On the toy run (tests/test_pipeline.py's TOY):

- ``eto-iter`` killed in DPO's save (its weights then cut short, as a kill in the middle of writing
  them would leave them): the DPO stage is not done, nothing after it ran, and the same command
  again finishes the iteration (it used to say "1 iterations done" from the half-saved folder's
  ``config.json``) by resuming the last checkpoint; the policy is whole and equals, byte for byte,
  an uninterrupted run's (resume determinism, tests/test_resume.py); exploration and pairs are
  not redone (byte-identical);
- ``bc`` killed in its save: ``eto-iter`` refuses the unfinished policy (it used to explore from
  it), and ``bc`` again finishes it, equal byte for byte to the uninterrupted bc's;
- a rerun of a finished ``bc`` with another config, killed in its save: the half-saved policy is
  in ``bc/.next`` and the finished one stays in place, whole and "done"; the same command again
  resumes there and swaps the new policy in.
"""

from __future__ import annotations

import json
import shutil
import signal
from pathlib import Path

import pytest
from background import Background, eto_train, one_thread_env
from test_pipeline import ROOT, TOY

from eto_train.model.load import CheckpointError
from eto_train.store import is_identity_file
from eto_train.training.save import check_policy

ITER = ["eto.iterations=1"]


class Cli(Background):
    """``eto-train <stage>`` on the toy run in the background (tests/background.py)."""

    def __init__(self, stage: str, runs: Path, *extra: str, kill_at: str | None = None):
        log = runs / f"{stage}-{len(list(runs.glob('*.log')))}.log"
        super().__init__(eto_train(stage, f"paths.runs={runs}", "run_name=toy", *TOY, *extra), log,
                         one_thread_env(kill_at))


def cli(stage: str, runs: Path, *extra: str, kill_at: str | None = None) -> tuple[int, str]:
    return Cli(stage, runs, *extra, kill_at=kill_at).wait()


def _squash(text: str) -> str:
    return "".join(text.split())  # rich wraps long lines


def _status(stage_dir: Path) -> str:
    return json.loads((stage_dir / "manifest.json").read_text())["status"]


def _files(folder: Path) -> dict[str, bytes]:
    """Each file's bytes, but the hash cache's sidecar (store.identity_sha256 writes it on a first check)."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file() and not is_identity_file(p.name)}


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    """experts, model and bc of the toy run, uninterrupted (copied for each trial)."""
    runs = tmp_path_factory.mktemp("base")
    for stage in ("experts", "model", "bc"):
        rc, out = cli(stage, runs)
        assert rc == 0, out[-3000:]
    return runs


def _copy(base: Path, dst: Path) -> Path:
    shutil.copytree(base, dst, symlinks=True, ignore=shutil.ignore_patterns("*.log"))
    return dst


def test_sigkill_inside_dpo_save_then_rerun_finishes_it_equal_to_an_uninterrupted_run(base, tmp_path):
    ref, runs = _copy(base, tmp_path / "ref"), _copy(base, tmp_path / "killed")
    reference = Cli("eto-iter", ref, *ITER)  # alongside: the kill point is deterministic
    rc, out = cli("eto-iter", runs, *ITER, kill_at="dpo/iter1/save:1")
    assert rc == -signal.SIGKILL, out[-3000:]
    assert "ETO_TRAIN_KILL_AT=dpo/iter1/save:1: SIGKILL" in out
    it = runs / "toy" / "eto" / "iter1"
    dpo, policy = it / "dpo", it / "dpo" / "model"
    # killed after the weights, before the tokenizer: the stage is not done, nothing after it ran
    assert _status(dpo) == "running"
    assert (policy / "model.safetensors").exists() and (policy / "config.json").exists()
    assert not (policy / "tokenizer_config.json").exists()
    assert not (it / "eval").exists() and not (it / "summary.json").exists()
    # as if the kill had come in the middle of writing the weights
    weights = policy / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    with pytest.raises(CheckpointError):
        check_policy(policy)
    upstream = {name: _files(it / name) for name in ("explore", "pairs")}

    rc, out = cli("eto-iter", runs, *ITER)
    assert rc == 0, out[-3000:]
    assert _squash(f"[dpo/iter1] resuming from the last checkpoint {dpo}/checkpoints/checkpoint-2") in _squash(out)
    assert "[explore/iter1] up to date" in out
    assert _status(dpo) == "done"
    check_policy(policy)  # loads, finite
    assert {name: _files(it / name) for name in ("explore", "pairs")} == upstream  # not redone
    assert json.loads((it / "summary.json").read_text())["policy"] == str(policy)

    rc, ref_out = reference.wait()
    assert rc == 0, ref_out[-3000:]
    ref_it = ref / "toy" / "eto" / "iter1"
    assert _files(policy) == _files(ref_it / "dpo" / "model")  # weights, config, tokenizer: byte for byte
    assert (it / "pairs" / "pairs.jsonl").read_bytes() == (ref_it / "pairs" / "pairs.jsonl").read_bytes()

    rc, out = cli("eto-iter", runs, *ITER)  # and the iteration now counts as done
    assert rc == 0 and "1 iterations done: the cap eto.iterations=1 is reached" in out, out[-3000:]


def test_sigkill_inside_bc_save_then_rerun_finishes_it_and_nothing_uses_it_before(base, tmp_path):
    runs = _copy(base, tmp_path / "killed")
    shutil.rmtree(runs / "toy" / "bc")
    upstream = {name: _files(runs / "toy" / name) for name in ("experts", "model")}
    rc, out = cli("bc", runs, kill_at="bc/save:2")
    assert rc == -signal.SIGKILL, out[-3000:]
    assert "ETO_TRAIN_KILL_AT=bc/save:2: SIGKILL" in out
    bc = runs / "toy" / "bc"
    # every file written, not yet checked: the stage is not done, and the next stage refuses it
    assert _status(bc) == "running" and (bc / "model" / "tokenizer_config.json").exists()
    rc, out = cli("eto-iter", runs, *ITER)
    assert rc != 0
    assert _squash(f"{bc}/model: the bc stage that writes it has not finished") in _squash(out), out[-3000:]
    assert not (runs / "toy" / "eto").exists()

    rc, out = cli("bc", runs)
    assert rc == 0, out[-3000:]
    assert _squash(f"[bc] resuming from the last checkpoint {bc}/checkpoints/checkpoint-3") in _squash(out)
    assert _status(bc) == "done"
    check_policy(bc / "model")
    assert _files(bc / "model") == _files(base / "toy" / "bc" / "model")  # the uninterrupted bc, byte for byte
    assert {name: _files(runs / "toy" / name) for name in ("experts", "model")} == upstream


def test_sigkill_inside_the_save_of_a_finished_bc_rerun_keeps_the_finished_policy(base, tmp_path):
    runs = _copy(base, tmp_path / "killed")
    bc = runs / "toy" / "bc"
    finished = {"manifest": (bc / "manifest.json").read_bytes(), "model": _files(bc / "model")}
    rc, out = cli("bc", runs, "bc.learning_rate=1e-3", kill_at="bc/save:1")  # another config: the rerun works aside
    assert rc == -signal.SIGKILL, out[-3000:]
    # the half-saved policy is in .next (no tokenizer yet); the finished one stays in place, whole
    assert (bc / ".next" / "model" / "model.safetensors").exists()
    assert not (bc / ".next" / "model" / "tokenizer_config.json").exists()
    assert {"manifest": (bc / "manifest.json").read_bytes(), "model": _files(bc / "model")} == finished
    check_policy(bc / "model")

    rc, out = cli("bc", runs, "bc.learning_rate=1e-3")
    assert rc == 0, out[-3000:]
    assert _squash(f"[bc] resuming from the last checkpoint {bc}/.next/checkpoints/checkpoint-3") in _squash(out)
    m = json.loads((bc / "manifest.json").read_text())
    assert m["status"] == "done" and m["config"]["bc"]["learning_rate"] == 1e-3
    check_policy(bc / "model")
    assert _files(bc / "model") != finished["model"]  # the new result swapped in whole
    assert not (bc / ".next").exists() and not (bc / ".old").exists()


def test_a_killed_bc_whose_last_checkpoint_is_damaged_resumes_from_the_one_before(base, tmp_path):
    """Issue 37, trial row 4: bc killed after its checkpoint-4, whose optimizer.pt is then cut to 1,000
    bytes. Every rerun used to stop in the Trainer's load (PytorchStreamReader failed reading zip
    archive), the checkpoint neither named nor set aside. Now the rerun names it, sets it aside (kept),
    resumes from checkpoint-2 and finishes; the policy loads and is finite."""
    from eto_train.training.resume import SET_ASIDE

    runs = _copy(base, tmp_path / "killed")
    shutil.rmtree(runs / "toy" / "bc")
    longer = ["bc.max_steps=5", "bc.save_steps=2", "bc.save_total_limit=2"]
    rc, out = cli("bc", runs, *longer, kill_at="bc:5")
    assert rc == -signal.SIGKILL, out[-3000:]
    bc = runs / "toy" / "bc"
    assert sorted(p.name for p in (bc / "checkpoints").glob("checkpoint-*")) == ["checkpoint-2", "checkpoint-4"]
    opt = bc / "checkpoints" / "checkpoint-4" / "optimizer.pt"
    opt.write_bytes(opt.read_bytes()[:1000])
    cut = opt.read_bytes()

    rc, out = cli("bc", runs, *longer)
    assert rc == 0, out[-3000:]
    aside = bc / SET_ASIDE / "checkpoint-4"
    text = _squash(out)
    assert _squash(f"[bc] 1 checkpoint(s) in {bc}/checkpoints cannot be resumed: checkpoint-4: optimizer.pt: ") in text
    assert _squash(f"set aside (not deleted) as {aside}") in text
    assert _squash("So resuming from checkpoint-2, the newest checkpoint that loads") in text
    assert _squash(f"[bc] resuming from the last checkpoint {bc}/checkpoints/checkpoint-2") in text
    assert "Traceback" not in out
    assert _status(bc) == "done" and (aside / "optimizer.pt").read_bytes() == cut
    m = json.loads((bc / "manifest.json").read_text())
    assert m["metrics"]["optimizer_steps"] == 5 and m["metrics"]["resumed_from"] == "checkpoint-2"
    check_policy(bc / "model")


def test_a_full_disk_in_the_trainers_checkpoint_save_is_one_block_and_the_finished_bc_is_kept(base, tmp_path):
    """Issue 37, trial row 5: the disk fills while the Trainer saves a checkpoint of a bc rerun (another
    config, so it trains in bc/.next): torch's own error (``[enforce fail at inline_container.cc] ...
    unexpected pos``) named no path and no free space. Now: one block naming the checkpoint folder and
    the free space, exit 1; the finished bc byte-identical; the same command, space freed, finishes."""
    import shlex

    from test_cli_errors import _on_a_small_fs, shlex_cmd

    ckpt = base / "toy" / "bc" / "checkpoints" / "checkpoint-3"
    keep = (ckpt / "model.safetensors").stat().st_size + 64 * 1024  # the weights fit, the optimizer's state does not
    assert (ckpt / "optimizer.pt").stat().st_size > 2 * 64 * 1024
    bc_cmd = shlex_cmd("bc", "paths.runs=$M/runs", "run_name=toy", *TOY, "bc.learning_rate=1e-3")
    finished = "cd $M/runs/toy/bc && find model manifest.json -type f | sort | xargs sha256sum"
    script = (f"cp -a {shlex.quote(str(base))} $M/runs; rm -f $M/runs/*.log; {finished} > $M/before; "
              f"avail=$(df -B1 --output=avail $M | tail -1); head -c $((avail - {keep})) /dev/zero > $M/filler; "
              f"cd {shlex.quote(str(ROOT))}; {bc_cmd} 2> $M/err1; echo rc1=$?; ({finished}) | cmp -s - $M/before "
              f"&& echo finished-kept; rm $M/filler; {bc_cmd} > $M/out2 2>&1; echo rc2=$?; cat $M/err1; "
              f"tail -c 3000 $M/out2; python3 -c \"import json; print('status', json.load(open('$M/runs/toy/bc/"
              f"manifest.json'))['status'], json.load(open('$M/runs/toy/bc/manifest.json'))['config']['bc']"
              f"['learning_rate'])\"")
    proc = _on_a_small_fs(tmp_path, "size=20m", script)
    out = proc.stdout
    assert "rc1=1" in out and "finished-kept" in out and "rc2=0" in out, out[-4000:] + proc.stderr[-2000:]
    err = [line for line in out.splitlines() if line.startswith("eto-train bc:")]
    assert len(err) == 1, out[-4000:]
    assert err[0].startswith(f"eto-train bc: cannot write [bc] {tmp_path}/fs/runs/toy/bc/.next/checkpoints/checkpoint-")
    assert ": no space left on device (" in err[0] and " free of 20.0 MiB); free space and rerun the same command" in err[0]
    assert "Traceback" not in out and "inline_container" not in out
    assert "status done 0.001" in out
