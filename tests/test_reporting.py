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
