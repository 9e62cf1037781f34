"""results: a study's results kept outside its run folder. On a small study through the CLI, the aggregate
computed from the results folder alone (the run folder deleted) equals the one computed from the run folder;
units of one seed (each with its own BC) aggregate per arm; a finished unit is never replaced."""

from __future__ import annotations

import gzip
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from eto_train import layout, results
from eto_train.errors import ConfigError
from eto_train.evaluation import paired, successes
from eto_train.stats import two_stage_bootstrap_ci
from eto_train.store import write_json

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from test_seeds import TOY, _episodes  # noqa: E402  (the toy study and hand-built episodes of test_seeds)


def _cli(stage: str, runs: Path, *extra: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "eto_train.cli", stage, f"paths.runs={runs}", "run_name=toy", *TOY, *extra]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900)


def _without(agg: dict, *keys: str) -> dict:
    return {stage: {k: v for k, v in entry.items() if k not in keys} for stage, entry in agg.items()}


def test_the_aggregate_from_the_results_folder_alone_is_the_run_folder_s(tmp_path):
    runs, kept = tmp_path / "runs", tmp_path / "kept"
    proc = _cli("compare", runs, "seeds=[0,1]", "compare.variants=[trajectory]")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    from_run = json.loads((runs / "toy" / "seeds.json").read_text())
    proc = _cli("results", runs, "seeds=[0,1]", f"results.dir={kept}")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "seed 0, unit all: collected" in proc.stdout and "seed 1, unit all: collected" in proc.stdout
    unit = json.loads((kept / "seed1" / "all" / "unit.json").read_text())
    assert unit["seed"] == 1 and unit["machine"]["cpu"] and unit["machine"]["torch"] and unit["files"] > 10
    # every test episode of every policy, compressed; records with paths relative to the run; no weights
    names = {p.relative_to(kept / "seed1" / "all").as_posix() for p in (kept / "seed1" / "all").rglob("*") if p.is_file()}
    for policy in ("eval/bc", "compare/eval/trajectory", "compare/eval/control"):
        for split in ("seen", "unseen"):
            packed = kept / "seed1" / "all" / policy / split / "episodes.jsonl.gz"
            assert gzip.decompress(packed.read_bytes()) == (runs / "toy" / "seed1" / policy / split /
                                                            "episodes.jsonl").read_bytes()
    assert "compare/trajectory/pairs/stats.json" in names and "bc/manifest.json" in names
    assert "compare/trajectory/explore/manifest.json" in names  # its seconds and memory, not its episodes
    assert not any(n.endswith((".safetensors", ".bin")) or "explore/episodes" in n or n.startswith("cache/")
                   for n in names)
    saved = json.loads((kept / "seed1" / "all" / "compare" / "compare.json").read_text())
    assert saved["evaluations"]["trajectory"] == "compare/eval/trajectory"
    assert "peak_rss_gb" in json.loads((kept / "seed1" / "all" / "bc" / "manifest.json").read_text())["memory"]

    shutil.rmtree(runs)  # a fresh clone: no run folder
    (kept / "seeds.json").unlink()
    proc = _cli("results", tmp_path / "elsewhere", f"results.dir={kept}", "results.collect=false")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    from_kept = json.loads((kept / "seeds.json").read_text())
    assert set(from_kept) == {"compare"}
    assert _without(from_kept, "runs", "units") == _without(from_run, "runs")
    assert "| trajectory | seen | s0 " in (kept / "seeds.md").read_text()
    # the tables depend on the folder alone: not on the seed of the unit whose command wrote them last (a unit of
    # seed 1 runs `results` with seed=1; its bootstrap draws results.seed's, as a fresh clone's aggregate does)
    proc = _cli("results", tmp_path / "elsewhere", f"results.dir={kept}", "results.collect=false",
                "seeds=null", "seed=1")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert json.loads((kept / "seeds.json").read_text()) == from_kept


def _unit(folder: Path, seed: int, name: str, bc: dict, arms: dict[str, dict], control_of: str | None = None):
    """A collected unit by hand: its own BC and some arms on the split `seen`, compare.json as compare writes it."""
    u = folder / f"seed{seed}" / name
    _episodes(layout.episodes(u / "eval" / "bc", "seen"), bc)
    evaluations, table = {"bc": "eval/bc"}, {"bc": {"success": sum(bc.values()) / len(bc)}}
    for arm, won in arms.items():
        _episodes(layout.episodes(u / "compare" / "eval" / arm, "seen"), won)
        evaluations[arm] = f"compare/eval/{arm}"
    for arm in arms:
        row = {"success": sum(arms[arm].values()) / len(bc),
               "vs_bc": paired(successes(layout.episodes(u / "eval" / "bc", "seen")),
                               successes(layout.episodes(u / "compare" / "eval" / arm, "seen")), 200, 0)}
        table[arm] = row
    write_json(u / "compare" / "compare.json", {"evaluations": evaluations, "splits": {"seen": table},
                                                "dpo_steps": {}, "rollout_cost": {}})
    write_json(u / "unit.json", {"seed": seed, "unit": name, "layout": {"bc_eval": "eval/bc"}})
    return u


T = ["g/0", "g/1", "g/2", "g/3"]


def _won(*wins: int) -> dict[str, bool]:
    return {t: i in wins for i, t in enumerate(T)}


def test_units_of_a_seed_each_with_its_own_bc_aggregate_per_arm(tmp_path):
    # seed 0 played in two units on two machines: unit a's BC wins g/0, unit b's BC g/0 and g/1
    _unit(tmp_path, 0, "a", _won(0), {"trajectory": _won(0, 2)})              # trajectory vs a's BC: [0,0,+1,0]
    _unit(tmp_path, 0, "b", _won(0, 1), {"step": _won(1)})                    # step vs b's BC: [-1,0,0,0]
    _unit(tmp_path, 1, "all", _won(), {"trajectory": _won(3), "step": _won(2, 3)})
    agg = results.aggregate(tmp_path, 500, 0)["compare"]
    assert agg["seeds"] == [0, 1] and agg["units"] == {"seed0/a": 0, "seed0/b": 0, "seed1/all": 1}
    traj, step = agg["arms"]["trajectory"]["seen"]["vs_bc"], agg["arms"]["step"]["seen"]["vs_bc"]
    assert traj["per_seed"]["0"]["diff"] == 0.25 and traj["per_seed"]["1"]["diff"] == 0.25
    assert step["per_seed"]["0"]["diff"] == -0.25 and step["per_seed"]["1"]["diff"] == 0.5
    assert step["ci95"] == list(two_stage_bootstrap_ci([[-1.0, 0.0, 0.0, 0.0], [0.0, 0.0, 1.0, 1.0]], 500, 0)[1:])
    # each unit's BC is its own row in the play table: seed 0 has two
    assert set(agg["play"]["bc"]["seen"]) == {"0", "0 (seed0/b)", "1"}
    # an arm of a seed played in two units is refused
    _unit(tmp_path, 0, "c", _won(0), {"step": _won(0)})
    with pytest.raises(ValueError, match="seed 0: arm 'step' was played in two units"):
        results.aggregate(tmp_path, 500, 0)


def test_a_finished_unit_is_never_replaced(tmp_path):
    run, kept = tmp_path / "run", tmp_path / "kept" / "seed0" / "a"
    _episodes(layout.episodes(run / "eval" / "bc", "seen"), _won(0))
    write_json(run / "compare" / "compare.json", {"evaluations": {"bc": str(run / "eval" / "bc")}, "splits": {}})
    paths = {"bc_eval": "eval/bc", "compare": "compare"}
    assert results.collect(run, kept, 0, "a", paths) == "collected"
    assert results.collect(run, kept, 0, "a", paths) == "kept"  # the same results: nothing to do
    assert json.loads((kept / "compare" / "compare.json").read_text())["evaluations"]["bc"] == "eval/bc"
    _episodes(layout.episodes(run / "eval" / "bc", "seen"), _won(1))  # played again: other episodes
    with pytest.raises(ConfigError, match="unit 'a' is already in the results.*never replaced"):
        results.collect(run, kept, 0, "a", paths)
    with pytest.raises(ConfigError, match="no finished compare.json or eto/result.json"):
        results.collect(tmp_path / "empty", tmp_path / "kept" / "seed0" / "b", 0, "b", paths)


def test_an_arm_in_another_unit_meets_the_control_through_both_units_bcs(tmp_path):
    # seed 0: unit a has trajectory and the control, unit b the step arm, each with its own BC
    a = _unit(tmp_path, 0, "a", _won(0), {"trajectory": _won(0, 2), "control": _won(0, 1)})
    _unit(tmp_path, 0, "b", _won(0, 1), {"step": _won(1, 2, 3)})
    comp = json.loads((a / "compare" / "compare.json").read_text())  # the control's unit: its arms vs the control
    comp["splits"]["seen"]["trajectory"]["vs_control"] = {"diff": 0.0}
    write_json(a / "compare" / "compare.json", comp)
    agg = results.aggregate(tmp_path, 500, 0)["compare"]
    row = agg["arms"]["step"]["seen"]["vs_control"]
    # step - b's BC: [-1, 0, +1, +1]; control - a's BC: [0, +1, 0, 0]; difference per task [-1, -1, +1, +1]
    assert row["per_seed"]["0"] == {"diff": 0.0, "tasks": 4, "across_units": "seed0/b against seed0/a"}
    assert row["mean"] == 0.0 and row["tasks"] == 4
    assert agg["arms"]["trajectory"]["seen"]["vs_control"]["per_seed"]["0"] == {"diff": 0.0}  # its own unit's row
