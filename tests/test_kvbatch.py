"""The persistent KV-cached batch (rollouts/kvbatch.py): in-place cache growth and exact answers."""

from __future__ import annotations

import torch

from eto_train.model.load import load_model, load_tokenizer
from eto_train.rollouts.kvbatch import SpareLayer
from eto_train.rollouts.loop import GenerationConfig, Policy


def test_spare_layer_grows_in_place_and_equals_concatenation():
    g = torch.Generator().manual_seed(0)
    layer = SpareLayer()
    chunks = [torch.randn(3, 2, n, 4, generator=g) for n in (5, 1, 1, 7, 1)]
    ptrs = []
    for c in chunks:
        k, v = layer.update(c, -c)
        ptrs.append(k.untyped_storage().data_ptr())
    full = torch.cat(chunks, dim=2)
    assert torch.equal(layer.keys, full) and torch.equal(layer.values, -full)
    assert len(set(ptrs)) == 1  # one buffer: room was left after the first chunk, nothing copied since
    # rows dropped from outside (as KVBatch.keep does): the next update moves to a new buffer, exactly
    layer.keys, layer.values = layer.keys[[0, 2]], layer.values[[0, 2]]
    extra = torch.randn(2, 2, 1, 4, generator=g)
    k, v = layer.update(extra, -extra)
    assert torch.equal(k, torch.cat([full[[0, 2]], extra], dim=2)) and torch.equal(v, -k)
    assert layer.keys.shape == (2, 2, full.shape[2] + 1, 4)


def test_kv_session_answers_what_generate_answers_on_the_whole_conversation(tiny_model_dir):
    """Two turns of three conversations through one persistent session, with a row leaving
    and a new one joining, give the tokens HF generate gives for each whole conversation."""
    tok, model = load_tokenizer(str(tiny_model_dir)), load_model(str(tiny_model_dir))
    policy = Policy(model, tok, GenerationConfig(max_new_tokens=6))
    sys_ = {"role": "system", "content": "Actions: go, take"}
    convs = [[sys_, {"role": "user", "content": f"Task: reach room {i}\nObservation: a hall"}] for i in range(3)]
    session = policy.session()
    for _ in convs:
        session.add_row()
    first = session.step(convs)
    assert [r[0] for r in first] == [r[0] for r in policy.generate(convs)]
    assert all(r[2] > 0 for r in first)  # tokens were generated
    for c, (text, *_ ) in zip(convs, first):
        c += [{"role": "assistant", "content": text}, {"role": "user", "content": "You see a door."}]
    session.keep([0, 2])  # conversation 1 ended
    newcomer = [sys_, {"role": "user", "content": "Task: take the key\nObservation: a kitchen"}]
    session.add_row()
    second = [convs[0], convs[2], newcomer]
    assert [r[0] for r in session.step(second)] == [r[0] for r in policy.generate(second)]
