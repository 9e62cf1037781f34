"""`eto-train <stage> [hydra overrides]`: the stage table, its errors, and a stage run through the
console script the package installs (from another folder: the configs are found from the package)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from test_pipeline import ROOT, TOY

STAGES = ["experts", "model", "pretrain", "bc", "eval", "eto-iter", "eto", "reading", "compare", "demo", "report",
          "results", "export"]


def _cli(*args: str, env: dict | None = None, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "eto_train.cli", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=120, env={**os.environ, **(env or {})})


def test_the_stage_table_names_every_stage_and_each_resolves_to_a_function():
    from eto_train import cli

    assert list(cli.STAGES) == STAGES
    for name, entry in cli.STAGES.items():
        assert callable(entry.function()), name
        assert entry.help and "\n" not in entry.help
    # report, results and export start over when rerun; results and export have no run folder of their own to isolate
    assert [n for n, e in cli.STAGES.items() if not e.resume] == ["report", "results", "export"]
    assert [n for n, e in cli.STAGES.items() if not e.isolate] == ["results", "export"]


@pytest.mark.parametrize("args", [[], ["-h"], ["--help"]])
def test_no_stage_or_help_lists_the_stages_one_line_each(args):
    proc = _cli(*args)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("usage: eto-train <stage>")
    listed = [line.split()[0] for line in lines[lines.index("stages:") + 1:] if line.startswith("  ")]
    assert listed == STAGES
    assert str(ROOT / "configs") in proc.stdout  # where the configs come from


def test_an_unknown_stage_exits_2_naming_it_and_the_valid_ones():
    proc = _cli("trian", "run_name=x")
    assert proc.returncode == 2 and proc.stdout == ""
    first = proc.stderr.splitlines()[0]
    assert "unknown stage 'trian'" in first and all(s in first for s in STAGES)


def test_the_job_name_is_the_stage_and_a_multirun_keeps_its_overrides():
    from eto_train.cli import with_job_name

    proc = _cli("eto-iter", "run_name=x", "--cfg", "hydra")
    assert proc.returncode == 0, proc.stderr
    assert "  name: eto_iter\n" in proc.stdout  # the log folder: <run>/logs/<time>-eto_iter
    assert with_job_name(["-m", "a=1", "b=1,2", "--cfg", "job"], "eto") == [
        "-m", "hydra.job.name=eto", "a=1", "b=1,2", "--cfg", "job"]
    assert with_job_name(["--cfg", "job"], "bc") == ["--cfg", "job", "hydra.job.name=bc"]
    proc = _cli("bc", "--cfg", "hydra", "hydra.job.name=mine")  # the command line wins
    assert proc.returncode == 0 and "  name: mine\n" in proc.stdout, proc.stderr


def test_configs_from_the_environment_variable(tmp_path):
    (tmp_path / "config.yaml").write_text("greeting: from ETO_TRAIN_CONFIGS\n")
    proc = _cli("report", "--cfg", "job", env={"ETO_TRAIN_CONFIGS": str(tmp_path)}, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "greeting: from ETO_TRAIN_CONFIGS"


def test_pretrain_gets_the_command_line_for_its_model_card(tmp_path):
    code = ("import eto_train.stages.pretrain as p\n"
            "p.run = lambda cfg, command=None: print('COMMAND:', command)\n"
            "import sys\nfrom eto_train.cli import main\n"
            f"sys.argv = ['eto-train', 'pretrain', 'paths.runs={tmp_path}', 'run_name=a b', 'wandb.enabled=false']\n"
            "main()\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert f"COMMAND: eto-train pretrain paths.runs={tmp_path} 'run_name=a b' wandb.enabled=false" in proc.stdout


def test_a_stage_through_the_console_script_from_another_folder(tmp_path):
    script = Path(sys.executable).parent / "eto-train"
    assert script.exists(), f"{script}: no console script (reinstall: pip install -e .)"
    runs, elsewhere = tmp_path / "runs", tmp_path / "cwd"
    elsewhere.mkdir()
    proc = subprocess.run([str(script), "experts", f"paths.runs={runs}", "run_name=toy", *TOY], cwd=elsewhere,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    run = runs / "toy"
    experts = [json.loads(line) for line in (run / "experts" / "train.jsonl").read_text().splitlines()]
    assert len(experts) == 4 * 2 and {e["game"] for e in experts} == {"mapreader", "twc"}
    assert all(e["status"] == "success" for e in experts)  # gold paths
    manifest = json.loads((run / "experts" / "manifest.json").read_text())
    assert manifest["status"] == "done"
    logs = [p.name for p in (run / "logs").iterdir()]
    assert len(logs) == 1 and logs[0].endswith("-experts")  # Hydra's job name is the stage
    assert not list(elsewhere.iterdir())  # nothing written where it was started


def test_the_demo_stage_runs_the_stages_of_the_demo_script_in_its_order():
    """scripts/demo.sh is the demo to read; `eto-train demo` runs its stages in one process: one list."""
    import re

    from eto_train.stages import demo

    script = (ROOT / "scripts" / "demo.sh").read_text()
    lines = re.findall(r"^eto-train ([a-z-]+) ", script, flags=re.M)
    assert tuple(lines) == demo.STAGES
    body = demo.run.__code__.co_names  # the stage modules it calls, in the order it calls them
    calls = [n for n in body if n in {"experts", "model", "bc", "evaluate", "eto", "compare", "reading", "report"}]
    assert [{"evaluate": "eval"}.get(n, n) for n in calls] == list(demo.STAGES)


def test_every_line_of_the_demo_script_composes_and_validates(tmp_path):
    """Each `eto-train <stage> ...` line of scripts/demo.sh, with its DEMO_ARGS, as bash passes it:
    a bad override on the sixth line must not wait for five stages to show (run with a stand-in
    python that records its arguments)."""
    import shlex

    from hydra import compose, initialize_config_dir

    from eto_train.config import load

    record = tmp_path / "calls.txt"
    fake = tmp_path / "python"
    fake.write_text(f'#!/usr/bin/env bash\nprintf "%q " "$@" >> {record}\necho >> {record}\n')
    fake.chmod(0o755)
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "demo.sh")], env={**os.environ, "PY": str(fake)},
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    calls = [shlex.split(line) for line in record.read_text().splitlines()]
    from eto_train.stages import demo

    assert [c[2] for c in calls] == list(demo.STAGES)  # -m eto_train.cli <stage> <overrides>
    with initialize_config_dir(str(ROOT / "configs"), version_base="1.3", job_name="demo_lines"):
        configs = {c[2]: load(compose("config", overrides=c[3:])) for c in calls}
    assert {cfg.run_name for cfg in configs.values()} == {"demo"}
    cfg = configs["compare"]
    assert cfg.seeds == [0, 1] and cfg.compare.variants == ["trajectory", "step_value", "anchor"]
    assert cfg.compare.arms["anchor"]["explore"]["tasks_per_game"] == 50
