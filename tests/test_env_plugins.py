"""Bring your own environment (issue 29): an out-of-tree adapter found through the entry point group
``eto_train.envs`` or named by import path (``env.adapter``), with no edit to eto-train.

tests/plugin_env is a real installable package (the example of docs/environments.md); the test
installs it with pip into a folder of its own (``--target``: no venv is touched) and runs the CLI with
that folder on PYTHONPATH, as a user's environment with the package installed would.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from test_pipeline import ROOT, TOY

PLUGIN = Path(__file__).resolve().parent / "plugin_env"
# the toy model/training/rollout sizes of the pipeline test; the env section is the plug-in's own defaults
TOY_NO_ENV = [o for o in TOY if not o.startswith("env.")]


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """tests/plugin_env installed (pip, no index, no dependencies: eto-train is this checkout) into a folder."""
    tmp = tmp_path_factory.mktemp("plugin")
    src, site = tmp / "src", tmp / "site"
    shutil.copytree(PLUGIN, src)  # the build writes build/ and *.egg-info beside the sources: not in tests/
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--no-index",
                    "--target", str(site), str(src)], check=True, capture_output=True, text=True, timeout=300)
    assert (site / "eto_lamps").is_dir()
    return site


def _environ(site: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), *filter(None, [os.environ.get("PYTHONPATH")])])}


def _python(site: Path, code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=_environ(site), capture_output=True, text=True,
                          timeout=120)


def _stage(site: Path, runs: Path, stage: str, *extra: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "eto_train.cli", stage, f"paths.runs={runs}", "run_name=lamps", "env=lamps",
           *TOY_NO_ENV, *extra]
    proc = subprocess.run(cmd, cwd=ROOT, env=_environ(site), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"{stage}: " + proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


def test_the_installed_plugin_is_listed_and_an_unknown_name_names_it(site):
    proc = _python(site, "from eto_train.envs import make_env, registry\n"
                         "print(registry.plugins())\n"
                         "try:\n    make_env({'name': 'nope'})\nexcept KeyError as e:\n    print(e)\n")
    assert proc.returncode == 0, proc.stderr
    listed, error = proc.stdout.splitlines()
    assert "'lamps': 'eto_lamps:LampsEnv'" in listed
    assert "unknown environment 'nope'" in error and "twx" in error and "lamps (eto_lamps:LampsEnv)" in error


def test_the_plugins_section_model_is_its_config(site):
    proc = _python(site, "from eto_train.envs import registry\n"
                         "print(registry.config_model('lamps').__name__, registry.plugin_defaults('lamps')['lamps'])\n")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["Config", "3"]


def test_bc_eto_iter_eval_on_a_plugin_environment(site, tmp_path):
    runs = tmp_path / "runs"
    for stage in ("experts", "model", "bc", "eto-iter", "eval"):
        _stage(site, runs, stage)
    run = runs / "lamps"
    experts = [json.loads(line) for line in (run / "experts" / "train.jsonl").read_text().splitlines()]
    assert len(experts) == 6 and {e["env"] for e in experts} == {"lamps"} and all(e["status"] == "success" for e in experts)
    assert {e["env_version"] for e in experts} == {"lamps-0.1 lamps=3"}  # the adapter's version, recorded
    assert json.loads((run / "eto" / "iter1" / "dpo" / "manifest.json").read_text())["status"] == "done"
    for split, n in (("seen", 3), ("unseen", 2)):
        m = json.loads((run / "eval" / "bc" / split / "metrics.json").read_text())
        assert m["overall"]["episodes"] == n and set(m["per_game"]) == {"lamps"}


def test_an_adapter_named_by_import_path_needs_no_entry_point(monkeypatch):
    from eto_train.envs import make_env

    monkeypatch.syspath_prepend(str(PLUGIN))  # importable, not installed: no entry point
    env = make_env({"name": "my-lamps", "adapter": "eto_lamps:LampsEnv", "lamps": 4,
                    "splits": {"train": {"start": 0, "count": 2}}})
    task = env.tasks("train")[1]
    instruction, first = env.reset(task)
    assert instruction == "Turn on lamp 2." and not first.done
    assert [env.step(a).success for a in env.expert_actions(task)] == [False, True]


def test_a_bad_adapter_path_is_an_error_naming_the_key():
    from eto_train.envs import make_env

    with pytest.raises(ValueError, match=r"env.adapter='nocolon'"):
        make_env({"name": "x", "adapter": "nocolon"})
    with pytest.raises(ImportError, match=r"env.adapter='no_such_pkg_h5:Env': cannot import"):
        make_env({"name": "x", "adapter": "no_such_pkg_h5:Env"})


def test_the_docs_one_liner_bc_env_lamps_runs_as_written(site, tmp_path, monkeypatch):
    """docs/environments.md says that after `pip install`, `eto-train bc env=lamps` works: on a fresh run
    folder it builds what `make bc` builds first (experts, the tiny model), then trains (issue 37)."""
    from eto_train import cli

    assert "`eto-train bc env=lamps` works" in (ROOT / "docs" / "environments.md").read_text()
    monkeypatch.syspath_prepend(str(site))  # installed: its entry point is found
    monkeypatch.setattr(sys, "argv", ["eto-train"])
    cli.main(["bc", "env=lamps", f"paths.runs={tmp_path}", "run_name=doc", *TOY_NO_ENV])  # the toy sizes only
    run = tmp_path / "doc"
    assert (run / "experts" / "train.jsonl").exists() and (run / "model" / "config.json").exists()
    assert json.loads((run / "bc" / "manifest.json").read_text())["status"] == "done"
