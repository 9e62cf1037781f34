"""Seeds: the two-stage (seeds, then tasks) bootstrap against hand computations, the seeds list's
rules, the compare arms' configs, and `compare` with seeds=[0,1] at toy size through the CLI.
"""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from fractions import Fraction as F
from pathlib import Path

import pytest

from eto_train.stats import _two_stage_means, two_stage_bootstrap_ci
from test_pipeline import TOY as PIPELINE_TOY

ROOT = Path(__file__).resolve().parents[1]


# -- the interval, by hand ----------------------------------------------------------------------

def test_the_point_estimate_is_the_mean_of_the_per_seed_means_not_the_pooled_mean():
    diffs = [[1, 0, 0, 1], [0, -1], [1, 1, 1]]  # per-seed means 1/2, -1/2, 1
    mean, lo, hi = two_stage_bootstrap_ci(diffs, n_boot=500, seed=0)
    assert mean == pytest.approx((0.5 - 0.5 + 1) / 3)  # 1/3; pooled over the 9 tasks it would be 4/9
    assert mean != pytest.approx(4 / 9)
    assert -1 <= lo <= mean <= hi <= 1


@pytest.mark.parametrize("value", [1.0, 0.0, -0.25])
def test_identical_seeds_with_a_constant_task_difference_give_a_zero_width_interval(value):
    diffs = [[value] * 5 for _ in range(4)]
    assert two_stage_bootstrap_ci(diffs, n_boot=300, seed=3) == pytest.approx((value, value, value))


# Two seeds x two tasks. Seed A's task differences [0, 1], seed B's [-1, 1].
# A task resample (2 draws of 2 tasks) has mean 0 (1/4), 1/2 (1/2), 1 (1/4) for A and -1 (1/4),
# 0 (1/2), 1 (1/4) for B. The seed resample is (A, A) 1/4, (A, B) or (B, A) 1/2, (B, B) 1/4, each
# drawn seed resampling its tasks afresh; the statistic is the mean of the two drawn seeds' means:
#   (A, A): 0 1/16, 1/4 1/4, 1/2 3/8, 3/4 1/4, 1 1/16
#   (A, B): -1/2 1/16, -1/4 1/8, 0 3/16, 1/4 1/4, 1/2 3/16, 3/4 1/8, 1 1/16
#   (B, B): -1 1/16, -1/2 1/4, 0 3/8, 1/2 1/4, 1 1/16
# weighted 1/4, 1/2, 1/4:
EXACT = {F(-1): F(1, 64), F(-1, 2): F(6, 64), F(-1, 4): F(4, 64), F(0): F(13, 64), F(1, 4): F(12, 64),
         F(1, 2): F(16, 64), F(3, 4): F(8, 64), F(1): F(4, 64)}
# cumulative: -1 1/64, -1/2 7/64, -1/4 11/64, 0 24/64, 1/4 36/64, 1/2 52/64, 3/4 60/64, 1 64/64:
# the 2.5% quantile is -1/2 (1/64 < 0.025 <= 7/64), the 97.5% one is 1 (60/64 < 0.975)
EXACT_LO, EXACT_HI = -0.5, 1.0
AB = [[0.0, 1.0], [-1.0, 1.0]]


def _quantile(dist: dict[F, F], q: float) -> float:
    acc = F(0)
    for v in sorted(dist):
        acc += dist[v]
        if acc >= F(q):
            return float(v)
    return float(max(dist))


def test_the_hand_enumerated_distribution_is_the_bootstrap_s_exactly():
    assert sum(EXACT.values()) == 1
    assert sum(v * p for v, p in EXACT.items()) == F(1, 4)  # its mean: the point estimate (1/2 + 0) / 2
    # the same distribution by brute force: every seed draw, then every task draw of each drawn seed
    brute: dict[F, F] = {}
    for s1, s2 in itertools.product(range(2), repeat=2):
        for t in itertools.product(range(2), repeat=4):
            a = F(int(AB[s1][t[0]] + AB[s1][t[1]]), 2)
            b = F(int(AB[s2][t[2]] + AB[s2][t[3]]), 2)
            brute[(a + b) / 2] = brute.get((a + b) / 2, F(0)) + F(1, 4 * 16)
    assert brute == EXACT
    assert (_quantile(EXACT, 0.025), _quantile(EXACT, 0.975)) == (EXACT_LO, EXACT_HI)


def test_a_large_bootstrap_matches_the_exact_distribution_and_its_quantiles():
    n = 40000
    draws = _two_stage_means(AB, n, seed=7)
    for v, p in EXACT.items():
        assert sum(abs(d - float(v)) < 1e-9 for d in draws) / n == pytest.approx(float(p), abs=0.01), v
    assert set(round(d, 9) for d in draws) <= {float(v) for v in EXACT}
    mean, lo, hi = two_stage_bootstrap_ci(AB, n_boot=n, seed=7)
    assert mean == 0.25 and (lo, hi) == (EXACT_LO, EXACT_HI)


def test_the_bootstrap_is_deterministic_for_a_seed():
    diffs = [[1, 0, -1, 1, 0], [0, 0, 1], [1, -1]]
    assert two_stage_bootstrap_ci(diffs, 1000, seed=5) == two_stage_bootstrap_ci(diffs, 1000, seed=5)
    assert _two_stage_means(diffs, 200, seed=5) == _two_stage_means(diffs, 200, seed=5)
    assert _two_stage_means(diffs, 200, seed=5) != _two_stage_means(diffs, 200, seed=6)


def test_one_seed_is_the_task_bootstrap_and_a_seed_without_tasks_is_refused():
    mean, lo, hi = two_stage_bootstrap_ci([[0.0, 1.0]], n_boot=4000, seed=1)
    assert (mean, lo, hi) == (0.5, 0.0, 1.0)  # task means 0 (1/4), 1/2 (1/2), 1 (1/4)
    with pytest.raises(ValueError, match="at least one paired task"):
        two_stage_bootstrap_ci([[1.0], []])


def test_paired_diffs_take_the_tasks_both_played_in_task_order():
    from eto_train.seeds import over_seeds, paired_diffs

    assert paired_diffs({"b": True, "a": False, "c": True}, {"a": True, "b": True, "d": False}) == [1.0, 0.0]
    agg = over_seeds({0: [1.0, 0.0], 1: [], 2: [0.0, 0.0, -1.0]}, n_boot=100, seed=0)
    assert agg["seeds"] == 2 and agg["tasks"] == 5 and agg["mean"] == pytest.approx((0.5 - 1 / 3) / 2)


def test_the_claim_reads_each_interval_and_an_arm_helps_only_beating_bc_and_control_on_every_split():
    from eto_train.seeds import claims, markdown, verdict

    assert [verdict(ci) for ci in ([0.01, 0.2], [-0.2, -0.01], [0.0, 0.3], [-0.1, 0.0], None)] == \
        ["beats", "loses", "tie", "tie", None]
    row = lambda lo, hi: {"mean": (lo + hi) / 2, "ci95": [lo, hi], "per_seed": {}}  # noqa: E731
    arms = {
        "good": {"seen": {"vs_bc": row(0.02, 0.1), "vs_control": row(0.01, 0.05)},
                 "unseen": {"vs_bc": row(0.03, 0.2), "vs_control": row(0.005, 0.1)}},
        "half": {"seen": {"vs_bc": row(0.02, 0.1), "vs_control": row(0.01, 0.05)},  # ties the control on unseen
                 "unseen": {"vs_bc": row(0.03, 0.2), "vs_control": row(-0.01, 0.1)}},
        "alone": {"seen": {"vs_bc": row(0.02, 0.1)}, "unseen": {"vs_bc": row(0.03, 0.2)}},  # never met the control
        "bad": {"seen": {"vs_bc": row(-0.2, -0.05), "vs_control": row(-0.3, -0.1)},
                "unseen": {"vs_bc": row(-0.1, 0.05), "vs_control": {"mean": None, "ci95": None, "per_seed": {}}}},
        "control": {"seen": {"vs_bc": row(0.02, 0.1)}, "unseen": {"vs_bc": row(0.02, 0.1)}},
        "untuned": {"seen": {"vs_bc": row(-0.5, -0.3)}},
    }
    c = claims(arms)
    assert set(c) == {"good", "half", "alone", "bad"}  # the comparator and the descriptive row claim nothing
    assert {arm: v["helps"] for arm, v in c.items()} == {"good": True, "half": False, "alone": False, "bad": False}
    assert c["half"]["splits"]["unseen"] == {"vs_bc": "beats", "vs_control": "tie"}
    assert c["alone"]["splits"]["seen"] == {"vs_bc": "beats", "vs_control": None}
    assert c["bad"]["splits"] == {"seen": {"vs_bc": "loses", "vs_control": "loses"},
                                  "unseen": {"vs_bc": "tie", "vs_control": None}}
    md = markdown({"compare": {"seeds": [0], "rule": "r", "bootstrap": 10, "arms": arms, "claim": c}})
    assert "| arm | seen vs BC | unseen vs BC | seen vs control | unseen vs control | helps |" in md
    assert "| good | beats | beats | beats | beats | yes |" in md and "| alone | beats | beats | - | - | no |" in md
    assert "| bad | loses | tie | loses | - | no |" in md and "| control | seen | " in md


# -- the config: seeds and arms -----------------------------------------------------------------

def _compose(overrides: list[str]):
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(str(ROOT / "configs"), version_base="1.3", job_name="seeds"):
        return compose("config", overrides=overrides)


@pytest.mark.parametrize("value", ["[0,0]", "[]", "[-1]", "3", "[0,1.5]", "[4294967296]"])
def test_a_bad_seeds_value_is_one_error_naming_seeds(value):
    from eto_train.config import ConfigError, load

    with pytest.raises(ConfigError) as err:
        load(_compose([f"seeds={value}"]))
    assert str(err.value).startswith("1 bad config value") and "\n  seeds=" in str(err.value)


def test_each_arm_is_its_eto_overrides_and_an_unknown_arm_is_named():
    from eto_train.config import ConfigError, load
    from eto_train.stages.compare import arm_config

    cfg = load(_compose(["seeds=[0,1,2,3,4]"]))
    assert cfg.seeds == [0, 1, 2, 3, 4] and cfg.compare.variants == ["trajectory", "step", "mixture"]
    anchor, traj = arm_config(cfg, "anchor"), arm_config(cfg, "trajectory")
    assert anchor.eto.explore.samples == 4 and anchor.eto.explore.rollout.generation.do_sample is True
    assert anchor.eto.pairs.contrast == "anchor" and anchor.eto.dpo == cfg.eto.dpo
    on = arm_config(cfg, "on_policy")
    assert on.eto.pairs.chosen == "self" and on.eto.explore.plain() == anchor.eto.explore.plain()  # one exploration
    assert traj.eto.explore.plain() == arm_config(cfg, "step_value").eto.explore.plain() == cfg.eto.explore.plain()
    with pytest.raises(ConfigError, match=r"compare.variants=\['trajectory', 'stepp'\]: a non-empty list, each entry "
                                          r"one of 'trajectory', 'step', 'mixture', 'step_value', 'anchor', 'on_policy'"):
        load(_compose(["compare.variants=[trajectory,stepp]"]))
    with pytest.raises(ConfigError, match="compare.arms.control is compare's own policy"):
        load(_compose(["+compare.arms.control={pairs:{contrast:step}}"]))
    with pytest.raises(ConfigError, match=r"compare.arms.step.pairs.contrast='steps': one of 'trajectory'"):
        load(_compose(["compare.arms.step={pairs:{contrast:steps}}"]))


# -- compare with two seeds, end to end ---------------------------------------------------------

TOY = [o for o in PIPELINE_TOY if not o.startswith("reading.")]  # tests/test_pipeline.py's toy run


def _cli(runs: Path, *extra: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "eto_train.cli", "compare", f"paths.runs={runs}", "run_name=toy", *TOY, *extra]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900)


def test_a_bad_seeds_value_stops_compare_before_any_work(tmp_path):
    proc = _cli(tmp_path, "seeds=[1,1]")
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "seeds=[1, 1]: distinct integers" in proc.stderr
    assert not (tmp_path / "toy" / "seed1").exists() and not (tmp_path / "toy" / "experts").exists()


def test_compare_with_two_seeds_runs_each_in_its_folder_and_aggregates_them(tmp_path):
    proc = _cli(tmp_path, "seeds=[0,1]", "compare.variants=[trajectory,step]")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    run = tmp_path / "toy"
    # the step arm's exploration is the trajectory arm's (equal settings), copied from the cache: once per seed
    assert proc.stdout.count("[explore/iter1] the same work already ran: reusing") == 2, proc.stdout[-3000:]
    per_seed = {}
    for k in (0, 1):
        folder = run if k == 0 else run / f"seed{k}"  # the run's own seed (0) is the run itself
        res = json.loads((folder / "compare" / "compare.json").read_text())
        assert res["seed"] == k and set(res["policies"]) == {"bc", "trajectory", "step", "control"}
        assert json.loads((folder / "bc" / "manifest.json").read_text())["config"]["seed"] == k
        assert (folder / "compare" / "trajectory" / "explore" / "episodes.jsonl").read_bytes() == \
            (folder / "compare" / "step" / "explore" / "episodes.jsonl").read_bytes()
        stats = json.loads((folder / "compare" / "step" / "pairs" / "stats.json").read_text())
        assert res["rollout_cost"]["step"] == {"episodes": stats["episodes"], "value_rollouts": 0,
                                               "total": stats["episodes"]} and stats["episodes"] == 2 * 3
        assert set(res["behaviour"]["seen"]["trajectory"]) >= {"invalid_action_rate", "loop_rate"}
        per_seed[k] = res
    # the same held-out tasks for every seed
    tasks = [{json.loads(x)["task_id"] for x in (folder / "eval" / "bc" / "seen" / "episodes.jsonl")
              .read_text().splitlines()} for folder in (run, run / "seed1")]
    assert tasks[0] == tasks[1] and len(tasks[0]) == 4

    agg = json.loads((run / "seeds.json").read_text())["compare"]
    assert agg["seeds"] == [0, 1] and agg["runs"] == {"0": str(run), "1": str(run / "seed1")}
    assert set(agg["arms"]) == {"trajectory", "step", "control"}
    for arm, by_split in agg["arms"].items():
        assert set(by_split) == {"seen", "unseen"}
        for split, d in by_split.items():
            assert set(d) == ({"vs_bc"} if arm == "control" else {"vs_bc", "vs_control"})
            for vs, row in d.items():
                assert row["per_seed"] == {str(k): per_seed[k]["splits"][split][arm][vs] for k in (0, 1)}
                assert row["mean"] == pytest.approx(sum(r["diff"] for r in row["per_seed"].values()) / 2)
                assert row["ci95"][0] <= row["mean"] <= row["ci95"][1] and row["seeds"] == 2
    assert agg["rollout_cost"]["trajectory"] == {str(k): per_seed[k]["rollout_cost"]["trajectory"] for k in (0, 1)}
    # what each arm trained on, and how each policy played, per seed
    for k in (0, 1):
        folder = run if k == 0 else run / f"seed{k}"
        for arm in ("trajectory", "step"):
            stats = json.loads((folder / "compare" / arm / "pairs" / "stats.json").read_text())
            assert agg["training"][arm][str(k)] == {"pairs": stats["pairs"], "dpo_steps": per_seed[k]["dpo_steps"][arm]}
        for split in ("seen", "unseen"):
            for name in ("bc", "trajectory", "step", "control"):
                play = agg["play"][name][split][str(k)]
                assert play["success"] == per_seed[k]["splits"][split][name]["success"]
                assert play["loop_rate"] == per_seed[k]["behaviour"][split][name]["loop_rate"]
                assert ("same_as_bc" in play) == (name != "bc") and 0.0 <= play.get("same_as_bc", 0.0) <= 1.0
    md = (run / "seeds.md").read_text()
    assert "## compare: seeds 0, 1" in md and "| trajectory | seen | s0 " in md and "| control | unseen |" in md
    assert "| arm | rollouts per seed | pairs per seed | DPO steps per seed |" in md and "| bc | seen | " in md

    before = {p: p.read_bytes() for p in (run / "seeds.json", run / "seed1" / "compare" / "step" / "dpo" / "manifest.json")}
    again = _cli(tmp_path, "seeds=[0,1]", "compare.variants=[trajectory,step]")
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert "up to date" in again.stdout
    assert {p: p.read_bytes() for p in before} == before


# -- eto with seeds: the loop and the aggregate, the stage stubbed by hand-built results -----------

def _episodes(path: Path, outcomes: dict[str, bool]) -> None:
    from eto_train.records import Episode, PolicyRef
    from eto_train.store import append_episodes

    path.parent.mkdir(parents=True, exist_ok=True)
    append_episodes(path, [Episode(episode_id=f"e-{t}", task_id=t, env="twx", game=t.split("/")[0], fold="test",
                                   seed=i, split="seen", env_version="x", policy=PolicyRef("p"), prompt_version="x",
                                   system="", first_user="", instruction="", first_observation="",
                                   status="success" if ok else "failure")
                           for i, (t, ok) in enumerate(outcomes.items())])


# per seed: BC's and the kept policy's outcomes on the same 4 seen tasks (hand-chosen)
ETO_OUTCOMES = {
    3: ({"g/0": False, "g/1": False, "g/2": True, "g/3": True}, {"g/0": True, "g/1": False, "g/2": True, "g/3": True}),
    8: ({"g/0": True, "g/1": True, "g/2": False, "g/3": False}, {"g/0": False, "g/1": True, "g/2": True, "g/3": True}),
}  # differences: seed 3 [+1, 0, 0, 0] (mean 1/4), seed 8 [-1, 0, +1, +1] (mean 1/4)


def test_eto_with_seeds_runs_each_seed_in_its_folder_and_aggregates_the_kept_policy_vs_bc(tmp_path):
    from eto_train import layout
    from eto_train.evaluation import paired, successes
    from eto_train.seeds import run_seeds

    cfg = _compose([f"paths.runs={tmp_path}", "run_name=r", "seeds=[3,8]", "compare.bootstrap=500",
                    "eval.splits=[seen]"])
    ran = []

    def stage(kcfg):  # what eto.run leaves: BC's and the kept policy's evaluations, and result.json
        runs = layout.RunLayout.of(kcfg)
        bc, best = ETO_OUTCOMES[kcfg.seed]
        _episodes(layout.episodes(runs.evaluation("bc"), "seen"), bc)
        _episodes(layout.episodes(runs.evaluation("eto_best"), "seen"), best)
        row = paired(successes(layout.episodes(runs.evaluation("bc"), "seen")),
                     successes(layout.episodes(runs.evaluation("eto_best"), "seen")), 500, kcfg.seed)
        from eto_train.store import write_json

        write_json(runs.eto_result, {"best_iteration": kcfg.seed % 3, "best_eval": str(runs.evaluation("eto_best")),
                                     "best_vs_bc": {"seen": {**row, "per_game": {"g": row}}}})
        ran.append((kcfg.seed, kcfg.seeds, kcfg.paths.run, kcfg.paths.bc, kcfg.run_name))

    result = run_seeds("eto", stage, cfg)
    run = tmp_path / "r"
    assert ran == [(k, None, str(run / f"seed{k}"), str(run / f"seed{k}" / "bc"), f"r/seed{k}") for k in (3, 8)]
    saved = json.loads((run / "seeds.json").read_text())
    assert saved == {"eto": json.loads(json.dumps(result))} and saved["eto"]["best_iteration"] == {"3": 0, "8": 2}
    row = saved["eto"]["arms"]["eto"]["seen"]["vs_bc"]
    for k in (3, 8):
        own = json.loads((run / f"seed{k}" / "eto" / "result.json").read_text())["best_vs_bc"]["seen"]
        assert row["per_seed"][str(k)] == {key: v for key, v in own.items() if key != "per_game"}
    assert row["per_seed"]["3"]["diff"] == row["per_seed"]["8"]["diff"] == 0.25
    assert row["mean"] == 0.25 and row["seeds"] == 2 and row["tasks"] == 8
    assert row["ci95"] == list(two_stage_bootstrap_ci([[1.0, 0.0, 0.0, 0.0], [-1.0, 0.0, 1.0, 1.0]], 500, 0)[1:])
    assert "## eto: seeds 3, 8" in (run / "seeds.md").read_text()
    assert "| eto | seen | s3 +25.0 pts, s8 +25.0 pts | +25.0 pts [" in (run / "seeds.md").read_text()


def test_the_untuned_model_played_once_is_paired_with_every_seed_s_bc(tmp_path):
    """compare's aggregate adds the untuned model (eto-train eval eval.tag=untuned, played once: greedy play of
    the model before BC depends on no seed) as a row against each seed's BC, by hand: untuned wins g/0 only."""
    from eto_train import layout
    from eto_train.evaluation import successes
    from eto_train.seeds import aggregate, markdown, seed_config
    from eto_train.store import write_json

    cfg = _compose([f"paths.runs={tmp_path}", "run_name=r", "seeds=[3,8]", "seed=3", "compare.bootstrap=500",
                    "compare.splits=[seen]"])
    configs = {k: seed_config(cfg, k) for k in (3, 8)}
    untuned = {"g/0": True, "g/1": False, "g/2": False, "g/3": False}
    _episodes(layout.episodes(layout.RunLayout.of(configs[3]).evaluation("untuned"), "seen"), untuned)  # seed 3's run
    for k, kcfg in configs.items():
        runs = layout.RunLayout.of(kcfg)
        bc = layout.episodes(runs.evaluation("bc"), "seen")
        _episodes(bc, ETO_OUTCOMES[k][0])
        write_json(layout.compare_file(runs.compare, ".json"), {
            "evaluations": {"bc": str(runs.evaluation("bc"))},
            "splits": {"seen": {"bc": {"success": sum(successes(bc).values()) / 4}}}})
    agg = aggregate("compare", configs, 500, 0)
    row = agg["arms"]["untuned"]["seen"]["vs_bc"]
    # seed 3: BC wins g/2, g/3 -> [+1, 0, -1, -1]; seed 8: BC wins g/0, g/1 -> [0, -1, 0, 0]
    assert row["per_seed"]["3"]["diff"] == -0.25 and row["per_seed"]["8"]["diff"] == -0.25
    assert row["mean"] == -0.25 and row["seeds"] == 2 and row["tasks"] == 8
    assert row["ci95"] == list(two_stage_bootstrap_ci([[1.0, 0.0, -1.0, -1.0], [0.0, -1.0, 0.0, 0.0]], 500, 0)[1:])
    assert agg["play"]["untuned"]["seen"]["3"]["success"] == agg["play"]["untuned"]["seen"]["8"]["success"] == 0.25
    assert "same_as_bc" in agg["play"]["untuned"]["seen"]["8"]  # (these hand-built episodes have no steps)
    assert "| untuned | seen | s3 -25.0 pts, s8 -25.0 pts | -25.0 pts [" in markdown({"compare": agg})
