"""The shipped base (models/twx-base-1.7m) is the one its card describes: the card's sha256 lines
match the committed files, so `make pretrain` rebuilds are checked against the same numbers."""

import hashlib
import re
from pathlib import Path

BASE = Path(__file__).resolve().parents[1] / "models" / "twx-base-1.7m"


def test_the_card_names_the_hashes_of_the_committed_weights_and_tokenizer():
    card = (BASE / "MODEL_CARD.md").read_text()
    listed = dict(re.findall(r"^- `([\w.]+)` `([0-9a-f]{64})`$", card, flags=re.M))
    assert set(listed) == {"model.safetensors", "tokenizer.json"}
    for name, digest in listed.items():
        assert hashlib.sha256((BASE / name).read_bytes()).hexdigest() == digest, name


def test_the_card_gives_the_command_that_rebuilds_it():
    card = (BASE / "MODEL_CARD.md").read_text()
    assert 'make pretrain ARGS="run_name=pre2 runtime.train_threads=1' in card
    assert "Reproduced bit for bit" in card
