"""A damaged run folder is named and mended (issue 26, rows 1-2 of its table).

On copies of one finished toy run (experts, tiny model, 3 BC steps, BC on `seen`, and a
100-episode evaluation, the demo's size):

- a finished stage's manifest damaged (a stray character, cut short, not a stage manifest, or
  missing beside the outputs) stops the stage with :class:`DamagedManifest` naming the file and
  what to do, before any rollout or training; nothing is deleted, every file byte-identical;
- done means whole: a truncated ``bc/model/model.safetensors``, a cut ``experts/train.jsonl``
  and a corrupt line in a finished ``episodes.jsonl`` are named by the stage that reads them
  (with the command that rebuilds them) and by the stage that wrote them, whose rerun redoes
  them (aside, then swapped in) while the other stages' files stay byte-identical.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from test_durability import _compose, _no_rollouts, files, finished_toy_run, manifest
from test_pipeline import TOY

from eto_train.locks import lock_path
from eto_train.manifest import NEXT, OUTPUT_FILES, DamagedInput, DamagedManifest, Stage

DEMO_EPISODES = 100  # the demo's evaluation size: 50 seeds of `seen` per game, two games


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A finished toy run, with BC evaluated on 4 `seen` episodes (tag bc) and on 100 (tag demo)."""
    from eto_train.stages.evaluate import evaluate_policy

    run, overrides = finished_toy_run(tmp_path_factory.mktemp("runs"))
    big = _compose([o for o in overrides if not o.startswith("env.splits.seen.count=")]
                   + [f"env.splits.seen.count={DEMO_EPISODES // 2}"])
    evaluate_policy(big, str(run / "bc" / "model"), "demo", ["seen"], run / "eval" / "demo")
    assert len((run / "eval" / "demo" / "seen" / "episodes.jsonl").read_text().splitlines()) == DEMO_EPISODES
    return run


@pytest.fixture
def run(finished, tmp_path):
    """A copy of the finished run (mtimes kept) and the overrides that address it; the tiny base
    model stays where the original's BC config names it, so the copy's stages are up to date."""
    copy = tmp_path / "runs" / "toy"
    shutil.copytree(finished, copy)
    overrides = [*TOY, f"paths.runs={tmp_path / 'runs'}", "run_name=toy", "eval.splits=[seen]",
                 f"paths.tiny_model={finished / 'model'}"]
    return {"run": copy, "overrides": overrides}


def _demo_cfg(overrides):
    return _compose([o for o in overrides if not o.startswith("env.splits.seen.count=")]
                    + [f"env.splits.seen.count={DEMO_EPISODES // 2}"])


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines()


def _played(data: bytes) -> list[dict]:
    """The episodes of an episodes.jsonl, less each step's wall-clock ``latency_s`` and the policy's
    folder (this copy's, not the original's): what a replay of the same greedy policy reproduces."""
    rows = [json.loads(x) for x in data.decode().splitlines()]
    for row in rows:
        row["policy"].pop("path")
        for step in row["steps"]:
            step.pop("latency_s")
            step.pop("env_s", None)  # the environment's wall-clock time
    return rows


# -- 1. a damaged manifest is never "not finished" -----------------------------------------------

DAMAGES = {
    "a stray character": lambda b: b[:1] + b"x" + b[1:],
    "cut short": lambda b: b[: len(b) // 2],
    "not a stage manifest": lambda b: b'["done"]\n',
    "an unknown status": lambda b: json.dumps({**json.loads(b), "status": "finished"}).encode(),
    "not UTF-8": lambda b: b"\xff\xfe" + b,
}


@pytest.mark.parametrize("damage", list(DAMAGES))
def test_a_damaged_eval_manifest_stops_eval_and_no_episode_is_deleted(run, damage, monkeypatch):
    from eto_train.stages.evaluate import evaluate_policy

    seen = run["run"] / "eval" / "demo" / "seen"
    mpath = seen / "manifest.json"
    mpath.write_bytes(DAMAGES[damage](mpath.read_bytes()))
    before, everything = files(seen), files(run["run"])
    assert len(_lines(seen / "episodes.jsonl")) == DEMO_EPISODES
    _no_rollouts(monkeypatch)
    with pytest.raises(DamagedManifest, match=rf"{mpath}: damaged stage manifest \(.+\)\. Nothing was changed.*"
                                              rf"Restore the file .*, or remove {seen} to redo the stage"):
        evaluate_policy(_demo_cfg(run["overrides"]), str(run["run"] / "bc" / "model"), "demo", ["seen"], seen.parent)
    assert files(seen) == before and files(run["run"]) == everything  # all 100 episodes, byte for byte
    assert not lock_path(seen).exists()  # released on the way out: the next run is not locked out


def test_a_damaged_eval_manifest_restored_is_up_to_date_and_removed_folder_is_redone(run, capsys):
    from eto_train.stages.evaluate import evaluate_policy

    seen = run["run"] / "eval" / "bc" / "seen"
    cfg, policy = _compose(run["overrides"]), str(run["run"] / "bc" / "model")
    whole = (seen / "manifest.json").read_bytes()
    episodes = (seen / "episodes.jsonl").read_bytes()
    (seen / "manifest.json").write_bytes(whole[:-3])
    with pytest.raises(DamagedManifest):
        evaluate_policy(cfg, policy, "bc", ["seen"], seen.parent)
    (seen / "manifest.json").write_bytes(whole)  # restored (the first remedy the error names)
    capsys.readouterr()
    evaluate_policy(cfg, policy, "bc", ["seen"], seen.parent)
    assert "[eval/bc/seen] up to date" in capsys.readouterr().out
    shutil.rmtree(seen)  # the other remedy: the stage is redone
    evaluate_policy(cfg, policy, "bc", ["seen"], seen.parent)
    assert manifest(seen)["status"] == "done" and _played((seen / "episodes.jsonl").read_bytes()) == _played(episodes)


def test_a_missing_manifest_beside_finished_episodes_is_an_error_not_a_replay(run, monkeypatch):
    from eto_train.stages.evaluate import evaluate_policy

    seen = run["run"] / "eval" / "demo" / "seen"
    (seen / "manifest.json").unlink()
    before = files(seen)
    _no_rollouts(monkeypatch)
    with pytest.raises(DamagedManifest, match=rf"{seen / 'manifest.json'}: damaged stage manifest \(missing, beside "
                                              rf"the outputs episodes.jsonl, metrics.json\)"):
        evaluate_policy(_demo_cfg(run["overrides"]), str(run["run"] / "bc" / "model"), "demo", ["seen"], seen.parent)
    assert files(seen) == before


def test_a_damaged_manifest_of_an_aside_rerun_stops_the_stage(run, monkeypatch):
    from eto_train.stages.evaluate import evaluate_policy

    seen = run["run"] / "eval" / "bc" / "seen"
    (seen / NEXT).mkdir()
    (seen / NEXT / "manifest.json").write_text('{"stage": "eval/bc/seen", "status": "runn')
    before = files(seen)
    _no_rollouts(monkeypatch)
    cfg = _compose(run["overrides"] + ["rollout.generation.max_new_tokens=5"])  # a rerun: it would work in .next
    with pytest.raises(DamagedManifest, match=rf"{seen / NEXT / 'manifest.json'}: damaged .* remove {seen} to redo"):
        evaluate_policy(cfg, str(run["run"] / "bc" / "model"), "bc", ["seen"], seen.parent)
    assert files(seen) == before


def test_a_corrupt_manifest_on_bc_is_a_named_error_and_nothing_is_deleted(run, monkeypatch):
    from eto_train.stages import bc

    bc_dir = run["run"] / "bc"
    (bc_dir / "manifest.json").write_bytes((bc_dir / "manifest.json").read_bytes().replace(b'"done"', b'"do'))
    before, everything = files(bc_dir), files(run["run"])
    monkeypatch.setattr(bc.recipe, "train", lambda *a, **k: pytest.fail("bc trained over a damaged manifest"))
    with pytest.raises(DamagedManifest, match=rf"{bc_dir / 'manifest.json'}: damaged stage manifest \(not valid JSON"):
        bc.run(_compose(run["overrides"]))
    assert files(bc_dir) == before and files(run["run"]) == everything
    assert not lock_path(bc_dir).exists()


# -- 2. done means whole, and stays checked ----------------------------------------------------------

def test_a_truncated_bc_checkpoint_is_named_by_eval_and_redone_by_bc(run, monkeypatch, capsys):
    from safetensors import safe_open

    from eto_train.model.load import CheckpointError
    from eto_train.stages import bc
    from eto_train.stages.evaluate import evaluate_policy

    r = run["run"]
    weights = r / "bc" / "model" / "model.safetensors"
    size = weights.stat().st_size
    weights.write_bytes(weights.read_bytes()[: size // 2])
    others = {k: v for k, v in files(r).items() if not k.startswith("bc/")}
    seen = r / "eval" / "bc" / "seen"
    _no_rollouts(monkeypatch)
    # the reader: names the file and the command that rebuilds it
    with pytest.raises(CheckpointError, match=rf"{weights}: corrupt safetensors .*Re-run `make bc` \(stage bc\)"):
        evaluate_policy(_compose(run["overrides"]), str(r / "bc" / "model"), "bc", ["seen"], seen.parent)
    # the writer: not "up to date", but the damage by name, then BC trained again (aside, swapped in)
    monkeypatch.undo()
    capsys.readouterr()
    bc.run(_compose(run["overrides"]))
    out = " ".join(capsys.readouterr().out.split())
    assert "[bc] up to date" not in out
    assert f"[bc] finished in {r / 'bc'}, but its outputs are not what it wrote: {weights}: {size} bytes when " \
           f"finished, now {size // 2} (cut short)" in out
    assert weights.stat().st_size == size and manifest(r / "bc")["status"] == "done"
    with safe_open(str(weights), framework="pt") as fh:  # whole again
        assert list(fh.keys())
    assert not (r / "bc" / NEXT).exists() and not (r / "bc" / ".old").exists()
    assert {k: v for k, v in files(r).items() if not k.startswith("bc/")} == others  # the other stages' files
    capsys.readouterr()
    bc.run(_compose(run["overrides"]))
    assert "[bc] up to date" in capsys.readouterr().out


def test_a_cut_experts_file_is_named_by_bc_and_redone_by_experts(run, monkeypatch, capsys):
    from eto_train.stages import bc, experts

    r = run["run"]
    train = r / "experts" / "train.jsonl"
    whole = train.read_bytes()
    train.write_bytes(whole[: len(whole) * 2 // 3])  # cut inside a line, as a full disk or a bad copy would
    before_bc = files(r / "bc")
    monkeypatch.setattr(bc.recipe, "train", lambda *a, **k: pytest.fail("bc trained on a cut experts file"))
    with pytest.raises(DamagedInput, match=rf"stage bc: input 'experts' is damaged: {train}: {len(whole)} bytes when "
                                           rf"finished, now {len(whole) * 2 // 3} \(cut short\)\. Re-run `make experts` "
                                           rf"\(stage experts\) to rebuild it"):
        bc.run(_compose(run["overrides"]))
    assert files(r / "bc") == before_bc
    capsys.readouterr()
    experts.run(_compose(run["overrides"]))  # not "up to date": the stage sees its file cut and redoes it
    out = " ".join(capsys.readouterr().out.split())
    assert "[experts] up to date" not in out and f"{train}: {len(whole)} bytes when finished" in out
    assert train.read_bytes() == whole and manifest(r / "experts")["status"] == "done"
    assert not (r / "experts" / NEXT).exists()
    capsys.readouterr()
    bc.run(_compose(run["overrides"]))  # the same experts again: BC is up to date, nothing retrained
    assert "[bc] up to date" in capsys.readouterr().out and files(r / "bc") == before_bc


def test_a_corrupt_line_in_finished_episodes_is_named_by_readers_and_redone_by_eval(run, capsys):
    from eto_train.records import RecordError
    from eto_train.stages.evaluate import evaluate_policy
    from eto_train.store import read_episodes

    r = run["run"]
    seen = r / "eval" / "demo" / "seen"
    file = seen / "episodes.jsonl"
    whole = file.read_bytes()
    lines = whole.split(b"\n")
    lines[40] = lines[40].replace(b'"', b"'", 1)  # one character of line 41: same size, not JSON
    file.write_bytes(b"\n".join(lines))
    others = {k: v for k, v in files(r).items() if not k.startswith("eval/demo/")}
    with pytest.raises(RecordError, match=rf"{file}:41: malformed JSON.*Re-run `make eval ARGS='eval.tag=demo "):
        read_episodes(file)  # what reading, report and eto meet
    capsys.readouterr()
    evaluate_policy(_demo_cfg(run["overrides"]), str(r / "bc" / "model"), "demo", ["seen"], seen.parent)
    out = " ".join(capsys.readouterr().out.split())
    assert "up to date" not in out
    assert f"{file}: changed since the stage finished (same size, other content)" in out
    assert _played(file.read_bytes()) == _played(whole)  # replayed whole (greedy: the same episodes), swapped in
    assert len(read_episodes(file)) == DEMO_EPISODES and manifest(seen)["status"] == "done"
    assert not (seen / NEXT).exists()
    assert {k: v for k, v in files(r).items() if not k.startswith("eval/demo/")} == others


# -- the Stage itself (no model) ---------------------------------------------------------------------

def _stage(d: Path, config=None) -> Stage:
    return Stage("toy", d, config or {"v": 1}, outputs=["out.txt", "ckpt"])


def _finish(d: Path, text: str, config=None) -> None:
    s = _stage(d, config)
    assert not s.done()
    s.begin()
    (s.work / "out.txt").write_text(text)
    (s.work / "ckpt").mkdir(exist_ok=True)
    (s.work / "ckpt" / "w").write_text(text)
    s.finish()


def test_finish_records_the_outputs_and_a_touch_without_change_is_still_done(tmp_path):
    import os

    d = tmp_path / "stage"
    _finish(d, "one")
    rec = manifest(d)[OUTPUT_FILES]
    assert set(rec) == {"out.txt", "ckpt"} and set(rec["ckpt"]["files"]) == {"ckpt/w"}
    assert rec["out.txt"]["files"]["out.txt"][0] == 3
    os.utime(d / "ckpt" / "w", ns=(1, 1))  # touched: other mtime, same bytes -> the hash says whole
    assert _stage(d).done()
    (d / "ckpt" / "w").write_text("owe")  # same size, other bytes
    s = _stage(d)
    assert not s.done() and s.damage == [f"{d / 'ckpt' / 'w'}: changed since the stage finished (same size, "
                                         f"other content)"]
    s.release()
    (d / "out.txt").unlink()
    s = _stage(d)
    assert not s.done() and f"{d / 'out.txt'}: missing" in s.damage
    s.release()


def test_a_manifest_from_before_the_record_is_still_up_to_date(tmp_path):
    from eto_train.store import write_json

    d = tmp_path / "stage"
    _finish(d, "one")
    m = manifest(d)
    del m[OUTPUT_FILES]
    write_json(d / "manifest.json", m)
    (d / "out.txt").write_text("two")  # unchecked: there is no record to check it against
    assert _stage(d).done()


def test_a_finished_stage_whose_config_differs_only_in_result_neutral_keys_is_up_to_date(tmp_path, capsys):
    """Logging and checkpoint frequency and activation checkpointing change how a training runs, not its result
    (manifest.RESULT_NEUTRAL): a finished stage is not retrained for them, and says which keys differ. Any other
    key, beside them or alone, still makes the stage work to do."""
    d = tmp_path / "stage"
    dpo = {"learning_rate": 5e-6, "save_steps": 200, "logging_steps": 10, "activation_checkpointing": False}
    _finish(d, "trained", {"dpo": dpo, "seed": 0})
    before = manifest(d)
    neutral = {**dpo, "save_steps": 10, "activation_checkpointing": True, "save_total_limit": 2}
    capsys.readouterr()
    assert _stage(d, {"dpo": neutral, "seed": 0}).done()
    out = capsys.readouterr().out
    assert ("its config differs only in dpo.activation_checkpointing, dpo.save_steps, dpo.save_total_limit, which "
            "change how it runs, not its result") in out
    assert manifest(d) == before  # nothing rewritten
    assert not _stage(d, {"dpo": {**neutral, "learning_rate": 1e-5}, "seed": 0}).done()
    assert not _stage(d, {"dpo": dpo, "seed": 1}).done()
    assert _stage(d, {"dpo": dpo, "seed": 0}).done()  # the finished config itself
