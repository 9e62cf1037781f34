"""The export for training drops fields and redacts secrets; the raw store stays as it was."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from test_bad_input import make_episode, make_pair

from eto_train.export import ExportConfig, export_training_data
from eto_train.records import RecordError
from eto_train.store import append_episodes, write_jsonl

SECRET = "sk-" + "A1b2C3d4" * 4
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def store(tmp_path):
    """An episode store whose tool output leaked a key, plus an environment failure."""
    leaky = make_episode(0)
    leaky.steps[0].observation = f"env: OPENAI_API_KEY={SECRET} ok"
    leaky.first_user = f"Task: go\nObservation: password: hunter2 and {SECRET}"
    path = tmp_path / "episodes.jsonl"
    append_episodes(path, [leaky, make_episode(1), make_episode(2, status="environment_failure")])
    return path


def _rows(path):
    return [json.loads(x) for x in path.read_text().splitlines()]


@pytest.mark.parametrize("fmt", ["eto", "messages", "episodes"])
def test_export_drops_fields_and_redacts_secrets(tmp_path, store, fmt):
    raw = store.read_bytes()
    drop = {"eto": ["reward"], "messages": ["task_id", "reward"], "episodes": ["policy.path", "steps.latency_s", "error"]}[fmt]
    out = tmp_path / "export" / "train.jsonl"
    report = export_training_data(store, out, ExportConfig(
        format=fmt, drop_fields=drop,
        redact_patterns=[r"sk-[A-Za-z0-9_-]{20,}", r"(?i)\b(password|secret|api[_-]?key)\s*[:=]\s*\S+"]))
    rows = _rows(out)
    text = out.read_text()
    assert len(rows) == 2 and report["exported"] == 2 and report["skipped"] == {"environment_failure": 1}
    assert SECRET not in text and "hunter2" not in text and "[REDACTED]" in text
    # the chat formats end on the last action: the last observation is not in them at all
    assert report["redactions"][r"sk-[A-Za-z0-9_-]{20,}"] == (2 if fmt == "episodes" else 1)
    for r in rows:
        for f in drop:
            head, _, rest = f.partition(".")
            assert head not in r if not rest else all(rest not in s for s in r[head])
    if fmt == "episodes":
        assert rows[0]["steps"][0]["observation"] == "env: OPENAI_API_KEY=[REDACTED] ok"
    assert store.read_bytes() == raw  # the raw store is never touched


def test_export_of_pairs_as_full_records(tmp_path):
    pairs = tmp_path / "pairs.jsonl"
    write_jsonl(pairs, [make_pair(rejected=[{"role": "assistant", "content": f"Action: type {SECRET}"}])])
    out = tmp_path / "pairs_export.jsonl"
    export_training_data([pairs], out, {"format": "episodes", "drop_fields": ["rejected_policy"],
                                        "redact_patterns": [r"sk-\w{20,}"]})
    (row,) = _rows(out)
    assert "rejected_policy" not in row and row["rejected"][0]["content"] == "Action: type [REDACTED]"


@pytest.mark.parametrize("cfg, message", [
    ({"drop_fields": ["stepz.observation"]}, r"export.drop_fields: \['stepz.observation'\] match no field"),
    ({"redact_patterns": ["(unclosed"]}, r"export.redact_patterns\[0\]: invalid regex"),
    ({"format": "csv"}, r"export.format: 'csv' is not one of"),
])
def test_bad_export_options_are_clear_errors_and_write_nothing(tmp_path, store, cfg, message):
    out = tmp_path / "train.jsonl"
    with pytest.raises(ValueError, match=message):
        export_training_data(store, out, cfg)
    assert not out.exists()


def test_export_never_writes_over_its_input_and_names_bad_lines(tmp_path, store):
    raw = store.read_bytes()
    with pytest.raises(ValueError, match="is also an input"):
        export_training_data(store, store)
    with open(store, "ab") as f:
        f.write(b'{"not": "a record"}\n')
    with pytest.raises(RecordError, match=rf"{store}:4: not an episode or pair record"):
        export_training_data(store, tmp_path / "out.jsonl")
    assert store.read_bytes() == raw + b'{"not": "a record"}\n' and not (tmp_path / "out.jsonl").exists()


def test_export_script_uses_the_config_block(tmp_path, store):
    out = tmp_path / "cli.jsonl"
    proc = subprocess.run([sys.executable, "-m", "eto_train.cli", "export", f"export.inputs=[{store}]",
                           f"export.output={out}", "export.format=messages", "export.drop_fields=[reward]",
                           f"hydra.run.dir={tmp_path / 'hydra'}"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = _rows(out)
    assert len(rows) == 2 and "reward" not in rows[0] and SECRET not in out.read_text()  # on by default
    report = json.loads(proc.stdout)
    assert report["redactions"] == {} and report["secrets_redacted"]  # no user patterns; the detector's kinds
