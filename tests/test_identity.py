"""Checkpoint identity: a folder's content hash is computed once, kept in ``.identity.json`` and
answered from there (a stat per file) while nothing changed; the hash itself is the same as ever."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from pathlib import Path

import pytest

from eto_train import store
from eto_train.model.load import policy_ref, weights_sha256
from eto_train.store import IDENTITY_FILE, file_sha256


def old_file_sha256(path) -> str:
    """file_sha256 as it was before the identity cache (the hash must not change), over the folder
    as it was then: without a sidecar (test_the_sidecar_is_never_part_of_a_hash checks that literally)."""
    p = Path(path)
    h = hashlib.sha256()
    files = sorted(f for f in p.rglob("*") if f.is_file() and f.name != IDENTITY_FILE) if p.is_dir() else [p]
    for f in files:
        h.update(str(f.relative_to(p) if p.is_dir() else f.name).encode())
        h.update(f.read_bytes())
    return h.hexdigest()


def old_weights_sha256(path) -> str:
    h = hashlib.sha256()
    for f in sorted(Path(path).glob("*.safetensors")):
        h.update(f.name.encode())
        h.update(f.read_bytes())
    return h.hexdigest()


def age(folder: Path, seconds: float = 100) -> None:
    """Date every file back: a checkpoint written a while ago (not 'racily' fresh)."""
    t = time.time_ns() - int(seconds * 1e9)
    for f in folder.rglob("*"):
        if f.is_file():
            os.utime(f, ns=(t, t))


def weights(path: Path, n: int) -> None:
    """A whole safetensors file of ``n`` random floats (new bytes, same size for the same ``n``)."""
    import numpy as np
    from safetensors.numpy import save_file

    save_file({"w": np.random.default_rng().standard_normal(n).astype("float32")}, str(path))


@pytest.fixture
def ckpt(tmp_path) -> Path:
    d = tmp_path / "model"
    (d / "sub").mkdir(parents=True)
    weights(d / "model-00001-of-00002.safetensors", 750)
    weights(d / "model-00002-of-00002.safetensors", 250)
    (d / "config.json").write_text('{"a": 1}')
    (d / "sub" / "tokenizer.json").write_text("{}")
    age(d)
    return d


@pytest.fixture
def reads(monkeypatch):
    """Count the files whose content the hashing opens."""
    opened: list[str] = []
    real = open

    def counting(f, *a, **k):
        opened.append(str(f))
        return real(f, *a, **k)

    monkeypatch.setattr(store, "open", counting, raising=False)
    return opened


def test_the_kept_hash_equals_the_full_hash_and_the_hash_of_before(ckpt):
    want, want_w = old_file_sha256(ckpt), old_weights_sha256(ckpt)
    assert file_sha256(ckpt) == want and weights_sha256(ckpt) == want_w  # computed, then kept
    assert (ckpt / IDENTITY_FILE).exists()
    assert file_sha256(ckpt) == want and weights_sha256(ckpt) == want_w  # from the sidecar
    assert file_sha256(ckpt, full=True) == want and weights_sha256(ckpt, full=True) == want_w
    ref = policy_ref(str(ckpt), name="bc")
    assert ref.weights_sha256 == want_w and ref.id == f"bc@{want_w[:12]}"
    kept = json.loads((ckpt / IDENTITY_FILE).read_text())["entries"]
    assert kept["file_sha256"]["sha256"] == want and kept["weights_sha256"]["sha256"] == want_w
    assert [r[0] for r in kept["file_sha256"]["files"]] == ["config.json", "model-00001-of-00002.safetensors",
                                                            "model-00002-of-00002.safetensors", "sub/tokenizer.json"]
    w = (ckpt / "model-00002-of-00002.safetensors").stat()
    assert kept["weights_sha256"]["files"][1] == ["model-00002-of-00002.safetensors", w.st_size, w.st_mtime_ns]


def test_a_single_file_hashes_as_before(ckpt):
    f = ckpt / "config.json"
    assert file_sha256(f) == old_file_sha256(f)


def test_the_second_check_reads_no_file_content(ckpt, reads):
    first = file_sha256(ckpt)
    assert len(reads) == 4
    reads.clear()
    assert file_sha256(ckpt) == first and weights_sha256(ckpt) and len(reads) == 2  # only the weights, once
    reads.clear()
    assert file_sha256(ckpt) == first and weights_sha256(ckpt) and reads == []
    assert policy_ref(str(ckpt)).weights_sha256 and reads == []


def test_full_rehashes_and_the_env_var_forces_it(ckpt, reads, monkeypatch):
    file_sha256(ckpt)
    reads.clear()
    file_sha256(ckpt, full=True)
    assert len(reads) == 4
    reads.clear()
    monkeypatch.setenv("ETO_TRAIN_FULL_HASH", "1")
    file_sha256(ckpt)
    weights_sha256(ckpt)
    policy_ref(str(ckpt))
    assert len(reads) == 4 + 2 + 2


def test_a_same_size_change_with_a_new_mtime_is_rehashed(ckpt):
    before = file_sha256(ckpt)
    w = ckpt / "model-00002-of-00002.safetensors"
    before_w, size = weights_sha256(ckpt), w.stat().st_size
    weights(w, 250)  # the same size, new bytes, a new mtime
    assert w.stat().st_size == size
    age(ckpt, 50)
    assert file_sha256(ckpt) == old_file_sha256(ckpt) != before
    assert weights_sha256(ckpt) == old_weights_sha256(ckpt) != before_w
    kept = json.loads((ckpt / IDENTITY_FILE).read_text())["entries"]  # refreshed
    assert kept["file_sha256"]["sha256"] == old_file_sha256(ckpt)


def test_only_full_sees_a_change_that_kept_size_and_mtime(ckpt):
    """The limit of a stat check, and what full=True is for: new bytes under the old size and mtime."""
    before = file_sha256(ckpt)
    w = ckpt / "model-00001-of-00002.safetensors"
    st = w.stat()
    weights(w, 750)
    os.utime(w, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert w.stat().st_size == st.st_size
    assert file_sha256(ckpt) == before  # answered from the kept identity: no byte was read
    assert file_sha256(ckpt, full=True) == old_file_sha256(ckpt) != before
    assert file_sha256(ckpt) == old_file_sha256(ckpt)  # and the kept identity was refreshed


def test_a_file_added_or_removed_is_noticed(ckpt):
    before = file_sha256(ckpt)
    extra = ckpt / "sub" / "added.txt"
    extra.write_text("x")
    age(ckpt)
    added = file_sha256(ckpt)
    assert added == old_file_sha256(ckpt) != before
    extra.unlink()
    assert file_sha256(ckpt) == before
    w = ckpt / "model-00002-of-00002.safetensors"
    wb = weights_sha256(ckpt)
    w.rename(ckpt / "keep.bin")
    assert weights_sha256(ckpt) == old_weights_sha256(ckpt) != wb


@pytest.mark.parametrize("junk", [
    "", "{", '{"format": 1, "entries": {"file_sha256": {"sha256": "abc", "hashed_at_ns": 1, "files": []}}}',
    '{"format": 1, "entries": {"file_sha256": {"sha256": "' + "0" * 64 + '", "hashed_at_ns": "x", "files": []}}}',
    '{"format": 1, "entries": {"file_sha256": {"sha256": "' + "0" * 64 + '", "hashed_at_ns": 1, "files": [[1]]}}}',
    '{"format": 99, "entries": {}}', "[]", "\x00\xff garbage",
])
def test_a_corrupt_or_partial_sidecar_is_ignored_and_replaced(ckpt, junk):
    want = old_file_sha256(ckpt)  # before any sidecar
    (ckpt / IDENTITY_FILE).write_text(junk, encoding="latin-1")
    assert file_sha256(ckpt) == want
    assert json.loads((ckpt / IDENTITY_FILE).read_text())["entries"]["file_sha256"]["sha256"] == want


def test_a_sidecar_that_lies_about_stats_is_not_used(ckpt):
    """One whose file list does not match (another folder's, hand-copied) is not trusted."""
    want = file_sha256(ckpt)
    data = json.loads((ckpt / IDENTITY_FILE).read_text())
    data["entries"]["file_sha256"]["sha256"] = "f" * 64
    data["entries"]["file_sha256"]["files"][0][1] += 1
    (ckpt / IDENTITY_FILE).write_text(json.dumps(data))
    assert file_sha256(ckpt) == want


def test_the_sidecar_is_never_part_of_a_hash(ckpt, tmp_path):
    want = old_file_sha256(ckpt)
    weights_sha256(ckpt)
    file_sha256(ckpt)
    (ckpt / f".{IDENTITY_FILE}.123.abcd.tmp").write_text("a write cut short")
    assert file_sha256(ckpt) == want
    stage = tmp_path / "bc"  # a stage folder holding the checkpoint with its sidecar
    stage.mkdir()
    (stage / "manifest.json").write_text("{}")
    os.rename(ckpt, stage / "model")
    assert (stage / "model" / IDENTITY_FILE).exists()
    clean = tmp_path / "clean"  # the same folder as it was before sidecars existed
    shutil.copytree(stage, clean, ignore=shutil.ignore_patterns("*identity*"))
    assert not list(clean.rglob("*identity*"))
    literal = hashlib.sha256()  # the old file_sha256, literally (no file excepted)
    for f in sorted(f for f in clean.rglob("*") if f.is_file()):
        literal.update(str(f.relative_to(clean)).encode())
        literal.update(f.read_bytes())
    assert file_sha256(stage) == file_sha256(stage, full=True) == literal.hexdigest()


def test_fresh_files_are_hashed_but_not_kept(tmp_path):
    """Files written within the racy window (same timestamp tick possible) are not trusted by stats."""
    d = tmp_path / "fresh"
    d.mkdir()
    (d / "w.safetensors").write_bytes(b"abc")
    assert file_sha256(d) == old_file_sha256(d) and not (d / IDENTITY_FILE).exists()


def test_a_folder_that_cannot_be_written_gets_no_sidecar_and_no_error(ckpt, monkeypatch):
    def refuse(*a, **k):
        raise PermissionError(13, "Read-only file system")

    monkeypatch.setattr(store, "write_atomic", refuse)
    assert file_sha256(ckpt) == old_file_sha256(ckpt) and not (ckpt / IDENTITY_FILE).exists()
    assert weights_sha256(ckpt) == old_weights_sha256(ckpt)


def test_the_kept_identity_moves_with_a_rename_and_a_copytree(ckpt, tmp_path, reads):
    """A stage swaps its outputs in by rename; a sweep's cache copies them (mtimes kept)."""
    want = file_sha256(ckpt)
    weights_sha256(ckpt)
    moved = tmp_path / "stage" / "model"
    moved.parent.mkdir()
    os.rename(ckpt, moved)
    copied = tmp_path / "cache" / "model"
    shutil.copytree(moved, copied)
    reads.clear()
    assert file_sha256(moved) == file_sha256(copied) == want and reads == []
