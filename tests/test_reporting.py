"""reporting.stage_seconds: a run's stage seconds and peak memory per seed, reused stages counted once."""

from __future__ import annotations

import json
from pathlib import Path

from eto_train.reporting import stage_seconds, stage_seconds_markdown


def _stage(folder: Path, stage: str, seconds: float | None, status: str = "done", config_hash: str = "h",
           finished_at: str = "t", memory: dict | None = None) -> None:
    folder.mkdir(parents=True)
    (folder / "manifest.json").write_text(json.dumps({"stage": stage, "status": status, "seconds": seconds,
                                                      "config_hash": config_hash, "finished_at": finished_at,
                                                      **({"memory": memory} if memory else {})}))


NO_MEMORY = {"peak_rss_gb": None, "peak_children_rss_gb": None, "peak_device_gb": None}


def test_stage_seconds_per_seed_with_reused_stages_counted_once(tmp_path):
    run = tmp_path / "study"
    _stage(run / "bc", "bc", 10.0, config_hash="b", memory={"peak_rss_gb": 2.5, "peak_children_rss_gb": 0.0})
    _stage(run / "eto/iter1/explore", "explore/iter1", 5.0, config_hash="x")
    _stage(run / "compare/step/explore", "explore/iter1", 5.0, config_hash="x")  # the same exploration, reused
    _stage(run / "compare/step/dpo", "dpo/iter1", None, status="running")
    _stage(run / "cache/explore/abc", "explore/iter1", 5.0, config_hash="x")  # a copy: not a stage of the run
    _stage(run / "seed1/bc", "bc", 20.0, config_hash="b1",
           memory={"peak_rss_gb": 3.25, "peak_children_rss_gb": 0.4, "peak_device_gb": 1.5})
    _stage(run / "seed1/compare/step/explore", "explore/iter1", 7.0, config_hash="x", finished_at="t1")
    costs = stage_seconds(run)
    assert set(costs) == {0, 1}
    assert costs[0] == {"bc": {"status": "done", "seconds": 10.0, "reused": False, "peak_rss_gb": 2.5,
                               "peak_children_rss_gb": 0.0, "peak_device_gb": None},
                        "eto/iter1/explore": {"status": "done", "seconds": 5.0, "reused": False, **NO_MEMORY},
                        "compare/step/explore": {"status": "done", "seconds": 5.0, "reused": True, **NO_MEMORY},
                        "compare/step/dpo": {"status": "running", "seconds": None, "reused": False, **NO_MEMORY}}
    assert costs[1]["compare/step/explore"]["reused"] is False  # another finish: another stage
    md = stage_seconds_markdown(costs).splitlines()
    assert md[0] == "| stage | seed 0 | seed 1 |"
    cells = [[c.strip() for c in line.strip("|").split("|")] for line in md[2:]]
    rows = {c[0]: c[1:] for c in cells}
    assert list(rows)[:2] == ["bc", "eto/iter1/explore"]  # the seed's own stages before the compare arms
    assert rows["bc"] == ["10 s, 2.50 GB", "20 s, 3.25 GB + 0.40 GB children, GPU 1.50 GB"]
    assert rows["eto/iter1/explore"] == ["5 s", "-"]  # a manifest from before peak memory was recorded
    assert rows["compare/step/explore"] == ["5 s (reused)", "7 s"]
    assert rows["compare/step/dpo"] == ["running", "-"]
    assert rows["total, each stage once (largest peak)"] == ["15 s (0.0 h), 2.50 GB", "27 s (0.0 h), 3.25 GB"]


def _unit(folder: Path, seed: int, unit: str, collected_at: str) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "unit.json").write_text(json.dumps({
        "seed": seed, "unit": unit, "collected_at": collected_at, "commit": "86a1f8ce296c",
        "machine": {"cpu": "AMD EPYC", "cpu_capability": "AVX2", "torch": "2.13.0+cpu"}}))


def test_unit_costs_count_a_stage_copied_from_an_earlier_unit_of_the_seed_there(tmp_path):
    from eto_train.reporting import unit_costs, unit_costs_markdown

    res = tmp_path / "results"
    bc = {"config_hash": "b", "finished_at": "t0", "memory": {"peak_rss_gb": 4.0}}
    # collected second, listed first by name: the order is the collection's
    _unit(res / "seed0/a_later", 0, "trajectory", "2026-12-06T18:00:00+0000")
    _stage(res / "seed0/a_later/bc", "bc", 700.0, **bc)  # copied from the eto unit (the same manifest)
    _stage(res / "seed0/a_later/compare/trajectory/dpo", "dpo/iter1", 1000.0, config_hash="d", finished_at="t2",
           memory={"peak_rss_gb": 4.5})
    _stage(res / "seed0/a_later/compare/trajectory/explore", "explore/iter1", 50.0, config_hash="x", finished_at="t3",
           memory={"peak_rss_gb": 6.25})
    _unit(res / "seed0/eto", 0, "eto", "2026-12-06T16:00:00+0000")
    _stage(res / "seed0/eto/bc", "bc", 700.0, **bc)
    _stage(res / "seed0/eto/eval/bc/test_seen", "eval", 300.0, config_hash="e", finished_at="t1",
           memory={"peak_rss_gb": 4.25})
    _unit(res / "seed1/eto", 1, "eto", "2026-12-06T19:00:00+0000")
    _stage(res / "seed1/eto/bc", "bc", 650.0, **bc)  # another seed: its own stage, even with the same manifest
    rows = unit_costs(res)
    assert [(r["seed"], r["unit"], r["stages"], r["copied"], r["seconds"], r["peak_rss_gb"], r["peak_stage"])
            for r in rows] == [(0, "eto", 2, 0, 1000.0, 4.25, "eval/bc/test_seen"),
                               (0, "trajectory", 2, 1, 1050.0, 6.25, "compare/trajectory/explore"),
                               (1, "eto", 1, 0, 650.0, 4.0, "bc")]
    md = unit_costs_markdown(rows).splitlines()
    assert md[3] == ("| 0 | trajectory | AMD EPYC (AVX2) | 2.13.0+cpu | 86a1f8c | 2026-12-06T18:00 | 2 (1) | "
                     "1,050 s (18 min) | 6.25 GB (compare/trajectory/explore) |")
