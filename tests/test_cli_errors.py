"""Errors as one clear block (issue 26, item 5): what `eto-train` prints and exits with, and what a
failed start leaves behind (nothing), a full disk and a read-only run folder named, a one-step
DPO's summary, and a paper-sized experiment on a CPU refused at once."""

from __future__ import annotations

import errno
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
from test_pipeline import ROOT, TOY

from eto_train import cli, errors


def _cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "eto_train.cli", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=120, env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})})


def _tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()} \
        if root.exists() else {}


def _one_block(proc, stage: str) -> str:
    """stderr: `eto-train <stage>: ...` and nothing of Hydra's traceback; no stdout."""
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr and "Error executing job" not in proc.stderr
    assert "HYDRA_FULL_ERROR" not in proc.stderr
    assert proc.stderr.startswith(f"eto-train {stage}: "), proc.stderr
    return proc.stderr


def test_a_refused_value_is_one_block_exit_2_and_no_folder_is_written(tmp_path):
    proc = _cli("bc", f"paths.runs={tmp_path}/runs", "run_name=r", "bc.num_train_epochs=-1")
    err = _one_block(proc, "bc")
    assert "bc.num_train_epochs=-1: a number > 0" in err  # key, value, what is allowed
    assert not (tmp_path / "runs").exists()  # not even Hydra's logs/<time>-bc


def test_the_full_traceback_with_the_environment_variable(tmp_path):
    for var in (errors.TRACEBACK_ENV, "HYDRA_FULL_ERROR"):
        proc = _cli("bc", f"paths.runs={tmp_path}/runs", "run_name=r", "bc.num_train_epochs=-1", env={var: "1"})
        assert proc.returncode == 2
        assert "Traceback (most recent call last)" in proc.stderr and "in load" in proc.stderr
        assert proc.stderr.rstrip().endswith("bc.num_train_epochs=-1: a number > 0")


def test_a_key_of_another_section_names_where_it_lives(tmp_path):
    proc = _cli("eval", f"paths.runs={tmp_path}/runs", "run_name=r", "eval.beta=0.1")
    err = _one_block(proc, "eval")
    assert len(err.strip().splitlines()) == 1
    assert "eval.beta=0.1: no such key (eval has no 'beta': not in struct); did you mean eto.dpo.beta" in err
    assert "+eval.beta=0.1" in err and "eval has: policy, rollout, splits, tag" in err  # what is allowed
    # a misspelled key: its closest spellings
    err = _one_block(_cli("eval", f"paths.runs={tmp_path}/runs", "eval.tmperature=0"), "eval")
    assert "did you mean rollout.generation.temperature" in err
    assert not (tmp_path / "runs").exists()


def test_a_missing_config_option_is_one_block_listing_the_options(tmp_path):
    err = _one_block(_cli("bc", f"paths.runs={tmp_path}/runs", "experiment=nope"), "bc")
    assert "Could not find 'experiment/nope'" in err and "sciworld_llama2_7b" in err
    assert "Config search path" not in err


def test_a_failed_start_after_hydra_started_leaves_the_run_folder_as_it_was(tmp_path):
    """An input error inside the job (here a policy folder that does not exist): Hydra's log folder
    of this command is removed; what the run folder held is untouched."""
    run = tmp_path / "runs" / "r"
    (run / "logs" / "20260101-000000-bc").mkdir(parents=True)
    (run / "logs" / "20260101-000000-bc" / "bc.log").write_text("an earlier run's log\n")
    (run / "kept.txt").write_text("finished work\n")
    before = _tree(run)
    proc = _cli("eval", f"paths.runs={tmp_path}/runs", "run_name=r", *TOY, f"eval.policy={tmp_path}/no_such_policy")
    err = _one_block(proc, "eval")
    assert f"{tmp_path}/no_such_policy" in err
    assert _tree(run) == before
    assert sorted(p.name for p in (run / "logs").iterdir()) == ["20260101-000000-bc"]
    assert not (run / "eval").exists()  # nor an empty eval/<tag>/


def test_a_paper_experiment_on_a_cpu_stops_at_the_device_check(tmp_path):
    proc = _cli("bc", "experiment=sciworld_llama2_7b", f"paths.runs={tmp_path}/runs",
                env={"HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(tmp_path / "hub"), "CUDA_VISIBLE_DEVICES": ""})
    err = _one_block(proc, "bc")
    assert err.startswith("eto-train bc: DeviceError: model llama2-7b-chat (meta-llama/Llama-2-7b-chat-hf, "
                          "about 7.0B parameters, bfloat16, full fine-tuning) needs a CUDA GPU; this machine has none")
    assert "make rehearse" in err
    assert "not in the Hugging Face cache" in err  # and, in the same message, the weights are not here either
    assert not (tmp_path / "runs").exists()


def test_the_device_check_passes_small_models_and_sizes_from_config_json(tmp_path):
    from omegaconf import OmegaConf

    from eto_train.device_check import DeviceError, check_device, parameters

    assert parameters("meta-llama/Llama-2-7b-chat-hf") == 7e9
    assert parameters("Qwen/Qwen2.5-7B-Instruct") == 7e9 and parameters("google/gemma-3-1b-it") == 1e9
    (tmp_path / "config.json").write_text('{"hidden_size": 4096, "num_hidden_layers": 32, "vocab_size": 32000, '
                                          '"intermediate_size": 11008}')
    assert 6.5e9 < parameters(str(tmp_path)) < 6.9e9  # Llama-2-7B's shape
    cfg = OmegaConf.create({"model": {"name": "m", "path": str(tmp_path), "build": False, "dtype": "bfloat16",
                                      "lora": None, "quantization": None}, "eval": {"policy": "x"}})
    with pytest.raises(DeviceError, match=r"about 6\.\dB parameters, bfloat16, full fine-tuning\) needs a CUDA GPU"):
        check_device(cfg, "bc")
    check_device(cfg, "report")  # reads files only
    cfg.model.path = "google/gemma-3-1b-it"
    check_device(cfg, "bc")  # 1B: rehearses on a CPU


def test_a_full_disk_names_the_stage_the_path_the_free_space_and_how_to_resume(tmp_path, monkeypatch, capsys):
    """ENOSPC while the experts stage writes its file: one block, exit 1, the run folder without
    a log folder of this command, and the rerun (space freed) finishes."""
    import eto_train.stages.experts as experts_stage  # imported before store is patched (it binds store's writer)
    from eto_train import store

    def full(path, rows):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))

    monkeypatch.setattr(sys, "argv", ["eto-train"])
    with monkeypatch.context() as m:  # the full disk, then space freed (undone here, not by the test's end)
        m.setattr(store, "write_jsonl", full)
        m.setattr("eto_train.stages.experts.write_jsonl", full)
        with pytest.raises(SystemExit) as exit_:
            cli.main(["experts", f"paths.runs={tmp_path}/runs", "run_name=r", *TOY])
        assert exit_.value.code == 1
        err = capsys.readouterr().err
        assert err.startswith("eto-train experts: cannot write [experts] ") and "Traceback" not in err
        assert "train.jsonl: no space left on device (" in err and " free of " in err
        assert "free space and rerun the same command: finished work is kept" in err
        assert not list((tmp_path / "runs" / "r").glob("logs/*"))
    assert experts_stage.write_jsonl is store.write_jsonl  # the real writer is back
    cli.main(["experts", f"paths.runs={tmp_path}/runs", "run_name=r", *TOY])
    assert (tmp_path / "runs" / "r" / "experts" / "train.jsonl").stat().st_size > 0


def test_a_read_only_folder_is_named_and_the_log_goes_elsewhere(tmp_path, monkeypatch, capsys):
    """A run folder that cannot be written (simulated: as root, permission bits do not stop writes):
    the log folder goes to a temporary folder with a one-line note, and a write the stage needs
    fails as one block naming the path."""
    monkeypatch.setattr(errors, "writable", lambda folder: False)
    monkeypatch.setattr(sys, "argv", ["eto-train"])

    def read_only(path, rows):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(path))

    monkeypatch.setattr("eto_train.stages.experts.write_jsonl", read_only)
    with pytest.raises(SystemExit) as exit_:
        cli.main(["experts", f"paths.runs={tmp_path}/runs", "run_name=ro", *TOY])
    assert exit_.value.code == 1
    err = capsys.readouterr().err
    assert f"eto-train: note: {tmp_path}/runs/ro is not writable; this command's log folder is under " in err
    assert "read-only file system" in err and "make the folder writable" in err
    assert not (tmp_path / "runs" / "ro" / "logs").exists()


def test_disk_messages_name_path_and_free_space(tmp_path):
    text = errors.disk_message(OSError(errno.ENOSPC, "No space left", str(tmp_path / "a" / "episodes.jsonl")),
                               "eval/bc/seen")
    assert text.startswith(f"cannot write [eval/bc/seen] {tmp_path}/a/episodes.jsonl: no space left on device (")
    assert "free space and rerun" in text


def test_a_one_step_dpo_summary_has_the_values_trl_logged(tmp_path, tiny_model_dir, expert_episodes):
    """max_steps=1 with logging_steps=10: TRL's metrics are only in the Trainer's final entry."""
    from datasets import Dataset
    from test_dpo import DPO, _two_turn_pair

    from eto_train.config import DPOSection
    from eto_train.model.load import load_model, load_tokenizer
    from eto_train.stages.eto.dpo import last_dpo_log
    from eto_train.training.dpo import dpo_arguments, make_dpo_trainer

    tok, model = load_tokenizer(str(tiny_model_dir)), load_model(str(tiny_model_dir))
    pairs = [_two_turn_pair(e) for e in expert_episodes[:2]]
    ds = Dataset.from_list([{"prompt": p.prompt, "chosen": p.chosen, "rejected": p.rejected} for p in pairs])
    trainer = make_dpo_trainer(model, None, tok, ds,
                               dpo_arguments(DPOSection.model_validate({**DPO, "max_steps": 1, "logging_steps": 10}), tmp_path, 0))
    trainer.train()
    history = trainer.state.log_history
    assert not [h for h in history if "loss" in h]  # what the summary read before: nothing, so NaN
    last = last_dpo_log(history)
    for key in ("rewards/accuracies", "logps/chosen", "logps/rejected"):
        assert math.isfinite(last[key]), (key, last)


def _read_only_run(run: Path, *args: str) -> subprocess.CompletedProcess:
    """``eto-train <args>`` with ``run`` really read-only: a read-only bind mount in a mount namespace
    of its own as root (permission bits do not stop root), the permission bits otherwise."""
    command = [sys.executable, "-m", "eto_train.cli", *args]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    if os.geteuid() != 0:
        folders = [run, *[p for p in run.rglob("*") if p.is_dir()]]
        for f in folders:
            f.chmod(0o555)
        try:
            return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120, env=env)
        finally:
            for f in folders:
                f.chmod(0o755)
    import shlex
    import shutil

    if shutil.which("unshare") is None:
        pytest.skip("no unshare(1) to mount a folder read-only as root")
    script = (f"mount --bind {run} {run} && mount -o remount,bind,ro {run} || exit 99; "
              f"touch {run}/probe 2>/dev/null && exit 98; exec {shlex.join(command)}")
    proc = subprocess.run(["unshare", "-m", "sh", "-c", script], cwd=ROOT, capture_output=True, text=True,
                          timeout=120, env=env)
    if proc.returncode in (98, 99):
        pytest.skip(f"this machine cannot mount a folder read-only ({proc.stderr.strip()[:200]})")
    return proc


def test_export_runs_on_a_really_read_only_run_folder_and_a_writing_stage_names_the_path(tmp_path):
    runs = f"paths.runs={tmp_path}/runs"
    assert _cli("experts", runs, "run_name=r", *TOY).returncode == 0
    run = tmp_path / "runs" / "r"
    before = _tree(run)
    proc = _read_only_run(run, "export", runs, "run_name=r", f"export.output={tmp_path}/out.jsonl")
    assert proc.returncode == 0, proc.stderr
    assert f"eto-train: note: {run} is not writable; this command's log folder is under " in proc.stderr
    assert len((tmp_path / "out.jsonl").read_text().splitlines()) == 8
    proc = _read_only_run(run, "experts", runs, "run_name=r", *TOY, "env.splits.train.count=3")
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert f"eto-train experts: cannot write [experts] {run}/" in proc.stderr
    assert "read-only file system (" in proc.stderr and " free of " in proc.stderr
    assert _tree(run) == before


def test_a_refused_nan_checkpoint_leaves_no_empty_evaluation_folder(tmp_path, tiny_model_dir, monkeypatch):
    import shutil

    from hydra import compose, initialize_config_dir
    from safetensors.torch import load_file, save_file

    from eto_train.config import load
    from eto_train.rollouts import play
    from eto_train.stages.evaluate import evaluate_policy
    from eto_train.training.save import NonFiniteError

    nan = tmp_path / "nan_model"
    shutil.copytree(tiny_model_dir, nan)
    weights = load_file(str(nan / "model.safetensors"))
    name = sorted(weights)[0]
    weights[name] = weights[name].clone()
    weights[name].view(-1)[0] = float("nan")
    save_file(weights, str(nan / "model.safetensors"), metadata={"format": "pt"})
    monkeypatch.setattr(play, "make_policy", lambda *a, **k: pytest.fail("a NaN policy was loaded to play"))
    with initialize_config_dir(str(ROOT / "configs"), version_base="1.3", job_name="nan"):
        cfg = load(compose("config", overrides=[f"paths.runs={tmp_path}/runs", "run_name=r", *TOY]))
    out = tmp_path / "runs" / "r" / "eval" / "nan"
    with pytest.raises(NonFiniteError):
        evaluate_policy(cfg, str(nan), "nan", ["seen"], out)
    assert not out.exists()


# -- issue 37's trial rows: a run_name that leaves paths.runs, paths.runs a regular file -----------------
@pytest.mark.parametrize("name", ["../../escape", "a/../../b", "..", "/abs/run"])
def test_a_run_name_that_leaves_paths_runs_is_refused_before_anything_is_written(tmp_path, name):
    (tmp_path / "a" / "b").mkdir(parents=True)
    runs = tmp_path / "a" / "b" / "runs"
    proc = _cli("experts", f"paths.runs={runs}", f"run_name={name}", *TOY)
    err = _one_block(proc, "experts")
    assert f"run_name={name}: " in err and "a run's name is a folder name inside paths.runs" in err
    assert f"outside paths.runs={runs}" in err
    assert _tree(tmp_path) == {} and not runs.exists()  # no experts file, no log folder anywhere
    assert not Path("/abs").exists()


def test_a_run_name_with_a_slash_inside_paths_runs_still_runs(tmp_path):
    from eto_train.config import load
    from eto_train.layout import check_run_folder
    from omegaconf import OmegaConf

    cfg = OmegaConf.create({"run_name": "study/seed3", "paths": {"runs": str(tmp_path), "run": f"{tmp_path}/study/seed3"}})
    check_run_folder(cfg)  # no error
    with pytest.raises(errors.ConfigError, match=r"run_name='a/\.\./\.\./b': its '\.\.' leaves paths.runs"):
        from hydra import compose, initialize_config_dir

        with initialize_config_dir(str(ROOT / "configs"), version_base="1.3", job_name="t"):
            load(compose("config", overrides=[f"paths.runs={tmp_path}", "run_name=a/../../b"]))


def test_paths_runs_pointing_to_a_regular_file_is_one_block_exit_2(tmp_path):
    runs = tmp_path / "runs"
    runs.write_text("not a folder\n")
    proc = _cli("experts", f"paths.runs={runs}", "run_name=r", *TOY)
    err = _one_block(proc, "experts")
    assert f"paths.runs={runs}: {runs} is a regular file, not a folder; point paths.runs at a folder" in err
    assert "NotADirectoryError" not in err and "note:" not in err
    assert runs.read_text() == "not a folder\n" and sorted(p.name for p in tmp_path.iterdir()) == ["runs"]


def _on_a_small_fs(tmp_path: Path, mount_opts: str, script: str) -> subprocess.CompletedProcess:
    """``script`` (sh, ``$M`` the mount point) run with a fresh tmpfs of ``mount_opts`` at ``$M``, in a
    mount namespace of its own (as root; skipped where tmpfs cannot be mounted)."""
    import shutil

    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("needs root and unshare(1) to mount a small tmpfs")
    m = tmp_path / "fs"
    m.mkdir()
    full = f"mount -t tmpfs -o {mount_opts} tmpfs {m} || exit 99; M={m}; export M; {script}"
    proc = subprocess.run(["unshare", "-m", "sh", "-c", full], cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT / "src")})
    if proc.returncode == 99:
        pytest.skip(f"this machine cannot mount a tmpfs ({proc.stderr.strip()[:200]})")
    return proc


def test_no_free_inodes_says_inodes_not_space(tmp_path):
    """A file system with space left and no free inode: ENOSPC, said as inodes (one block, exit 1)."""
    cli_ = shlex_cmd("experts", "paths.runs=$M/runs", "run_name=r", *TOY)
    proc = _on_a_small_fs(tmp_path, "size=50m,nr_inodes=40", "mkdir $M/runs; i=0; while touch $M/f$i 2>/dev/null; "
                          f"do i=$((i+1)); done; {cli_}; echo rc=$?; ls -A $M/runs")
    out = proc.stdout
    assert "rc=1" in out, proc.stderr
    err = proc.stderr
    assert err.startswith("eto-train experts: cannot write [experts] ") and "Traceback" not in err
    assert "no free inodes left on its file system (0 of 40 inodes free" in err
    assert "MiB free of 50.0 MiB: the space is there, the file count is not" in err
    assert "remove files you do not need there" in err and "rerun the same command" in err
    assert "note:" not in err and len(err.strip().splitlines()) == 1


def shlex_cmd(*args: str) -> str:
    """``python -m eto_train.cli <args>`` for sh (``$M`` left for the shell to expand)."""
    import shlex

    return " ".join([shlex.quote(sys.executable), "-m", "eto_train.cli",
                     *(a if "$M" in a else shlex.quote(a) for a in args)])


def test_three_commands_started_together_each_keep_their_own_log_folder(tmp_path):
    """Issue 37, trial row 8: three `eval`s with different eval.tag started together wrote one log folder
    (`logs/<time>-eval/`, whose .hydra/overrides.yaml kept one tag). Each command now makes its own
    (cli._own_log_dir, the same for every stage: here three `export`s, a few seconds each, where an
    eval takes half a minute); a folder of the same second that exists already (here made for every
    second of the next minute) is never reused."""
    import time

    store = tmp_path / "episodes.jsonl"
    from test_bad_input import make_episode

    from eto_train.store import append_episodes

    append_episodes(store, [make_episode(i) for i in range(2)])
    logs = tmp_path / "runs" / "r" / "logs"
    logs.mkdir(parents=True)
    now = time.time()
    taken = {time.strftime("%Y%m%d-%H%M%S", time.localtime(now + s)) + "-export" for s in range(-2, 60)}
    for name in taken:  # an earlier command's log folder for every second the three may start in
        (logs / name / ".hydra").mkdir(parents=True)
        (logs / name / ".hydra" / "overrides.yaml").write_text("- an earlier command\n")
    procs = [subprocess.Popen([sys.executable, "-m", "eto_train.cli", "export", f"paths.runs={tmp_path}/runs",
                               "run_name=r", f"export.inputs=[{store}]", f"export.output={tmp_path}/out{i}.jsonl"],
                              cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              env={**os.environ, "OMP_NUM_THREADS": "1"}) for i in range(3)]
    outs = [p.communicate(timeout=300)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], [o[-2000:] for o in outs]
    for name in taken:
        assert (logs / name / ".hydra" / "overrides.yaml").read_text() == "- an earlier command\n"
    new = sorted(p for p in logs.iterdir() if p.name not in taken)
    assert len(new) == 3, sorted(p.name for p in logs.iterdir())
    outputs = []
    for folder in new:
        overrides = (folder / ".hydra" / "overrides.yaml").read_text()
        outputs += [i for i in range(3) if f"export.output={tmp_path}/out{i}.jsonl" in overrides]
        assert (folder / ".hydra" / "config.yaml").is_file() and (folder / "export.log").is_file()
    assert sorted(outputs) == [0, 1, 2]  # each command's resolved config is kept, in its own folder
    assert all((tmp_path / f"out{i}.jsonl").is_file() for i in range(3))


# -- issue 53, items 5-7: a damaged tokenizer.json, a non-ASCII run_name, a YAML alias bomb ------------------
def test_a_corrupt_tokenizer_json_is_named_with_its_line_and_column_before_anything_runs(tmp_path, tiny_model_dir):
    import shutil

    bad = tmp_path / "policy"
    shutil.copytree(tiny_model_dir, bad)
    lines = (bad / "tokenizer.json").read_text().splitlines()
    lines[250] = "  }, oops"  # a hand edit gone wrong on line 251
    (bad / "tokenizer.json").write_text("\n".join(lines) + "\n")
    proc = _cli("eval", f"paths.runs={tmp_path}/runs", "run_name=r", *TOY, f"eval.policy={bad}")
    err = _one_block(proc, "eval")
    assert err.startswith(f"eto-train eval: CheckpointError: {bad / 'tokenizer.json'}: not valid JSON at line 251 "
                          "column ") and "JSONDecodeError" not in err
    assert not (tmp_path / "runs").exists()  # no logs/ folder, no eval/ folder


def test_a_non_ascii_run_name_runs_and_a_failed_start_under_it_leaves_nothing(tmp_path):
    runs = tmp_path / "runs"
    proc = _cli("experts", f"paths.runs={runs}", "run_name='ünï'", *TOY, "env.splits.train.count=2")
    assert proc.returncode == 0, proc.stderr[-3000:]
    run = runs / "ünï"
    assert (run / "experts" / "train.jsonl").is_file()
    assert [p.name.endswith("-experts") for p in (run / "logs").iterdir()] == [True]  # its log folder, under it
    before = _tree(run)
    err = _one_block(_cli("eval", f"paths.runs={runs}", "run_name='ünï'", *TOY,
                          f"eval.policy={tmp_path}/no_such_policy"), "eval")
    assert f"{tmp_path}/no_such_policy" in err and _tree(run) == before  # no new log folder, no eval/


ALIAS_BOMB = "# @package _global_\na: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n" + "".join(
    f"{c}: &{c} [{', '.join([f'*{p}'] * 9)}]\n" for p, c in zip("abcdefgh", "bcdefghi"))  # 9^9 values


def test_a_yaml_alias_bomb_in_a_config_file_is_named_before_anything_runs(tmp_path):
    import shutil

    from eto_train.config_files import MAX_EXPANDED_VALUES, expanded_values

    assert expanded_values(ALIAS_BOMB) > MAX_EXPANDED_VALUES
    assert expanded_values("a: &a {x: 1}\nb: *a\nc: {<<: *a, y: 2}\n") < 100  # a plain anchor is fine
    configs = tmp_path / "configs"
    shutil.copytree(ROOT / "configs", configs)
    (configs / "experiment" / "bomb.yaml").write_text(ALIAS_BOMB)
    proc = _cli("bc", f"paths.runs={tmp_path}/runs", "experiment=bomb", env={cli.ENV_CONFIGS: str(configs)})
    err = _one_block(proc, "bc")
    assert err.startswith(f"eto-train bc: AliasBomb: {configs / 'experiment' / 'bomb.yaml'}: its YAML aliases")
    assert "alias bomb" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "runs").exists()
