"""lab/real_study.sh's housekeeping for amendment 1 (docs/lab/experiments.md): `seed-bc` copies a finished unit's
experts, BC and BC's test plays into a new unit of the same seed, refusing unfinished sources and begun units;
`prune` drops a unit's arm weights only once its results are committed."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STAGES = ["experts", "bc", "eval/bc/test_seen", "eval/bc/test_unseen"]


def _run(tmp_path, *args):  # from tmp_path: not from the checkout whose runs/ hold the units
    env = {"PATH": "/usr/bin:/bin", "STUDY": str(tmp_path / "study"), "RESULTS_REPO": str(tmp_path / "repo"),
           "PY": sys.executable, "PYTHONPATH": str(ROOT / "src")}
    return subprocess.run(["bash", str(ROOT / "lab" / "real_study.sh"), *args], env=env, capture_output=True,
                          text=True, timeout=60, cwd=tmp_path)


def _unit(tmp_path, name, status="done"):
    unit = tmp_path / "study" / "runs" / "real_study2" / name
    for s in STAGES:
        (unit / s).mkdir(parents=True)
        (unit / s / "manifest.json").write_text(json.dumps({"stage": s, "status": status}, indent=2))
        (unit / s / "out.bin").write_bytes(s.encode())
    return unit


def test_seed_bc_copies_the_four_finished_stages(tmp_path):
    src = _unit(tmp_path, "s1-eto")
    (src / "compare").mkdir()  # an arm's folder is not the seed's BC: never copied
    r = _run(tmp_path, "seed-bc", "1", "eto", "trajectory")
    assert r.returncode == 0, r.stderr
    dst = src.parent / "s1-trajectory"
    for s in STAGES:
        assert (dst / s / "out.bin").read_bytes() == s.encode()
        assert json.loads((dst / s / "manifest.json").read_text())["status"] == "done"
    assert not (dst / "compare").exists()


def test_seed_bc_refuses_an_unfinished_source_and_a_begun_unit(tmp_path):
    _unit(tmp_path, "s2-eto", status="running")
    r = _run(tmp_path, "seed-bc", "2", "eto", "step")
    assert r.returncode == 1 and "not a finished stage" in r.stderr and "s2-eto/experts" in r.stderr
    assert not (tmp_path / "study" / "runs" / "real_study2" / "s2-step").exists()
    _unit(tmp_path, "s0-eto")
    begun = _unit(tmp_path, "s0-step", status="running")
    r = _run(tmp_path, "seed-bc", "0", "eto", "step")
    assert r.returncode == 1 and "has begun" in r.stderr
    assert json.loads((begun / "bc" / "manifest.json").read_text())["status"] == "running"  # untouched


def test_prune_only_after_the_unit_is_committed(tmp_path):
    unit = _unit(tmp_path, "s1-step")
    (unit / "compare" / "step").mkdir(parents=True)
    (unit / "cache").mkdir()
    r = _run(tmp_path, "prune", "1", "step")
    assert r.returncode == 1 and "no committed results" in r.stderr
    assert (unit / "compare" / "step").is_dir()
    results = tmp_path / "repo" / "docs" / "results" / "real_study2" / "seed1" / "step"
    results.mkdir(parents=True)
    (results / "unit.json").write_text("{}")
    r = _run(tmp_path, "prune", "1", "step")
    assert r.returncode == 0, r.stderr
    assert not (unit / "compare").exists() and not (unit / "cache").exists()
    assert (unit / "bc" / "out.bin").exists()  # the seed's BC stays for the next unit


def test_status_reads_the_unit_under_study_and_names_its_seed(tmp_path):
    unit = _unit(tmp_path, "s2-value")
    for i, s in enumerate(STAGES):
        (unit / s / "manifest.json").write_text(json.dumps(
            {"stage": s, "status": "done", "seconds": 685.0 + i, "finished_at": str(i), "memory": {"peak_rss_gb": 4.0}}))
    r = _run(tmp_path, "status", "2", "value")
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[0] == "| stage | seed 2 |"
    assert "| bc | 686 s, 4.00 GB |" in r.stdout and "| total, each stage once (largest peak) | 2,746 s" in r.stdout
