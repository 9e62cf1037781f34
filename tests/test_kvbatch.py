"""The persistent KV-cached batch (rollouts/kvbatch.py): slots written in place, shared prompt prefixes,\nand answers equal to HF generate on the whole conversation."""

from __future__ import annotations

import pytest
import torch
from fixture_settings import generation

from eto_train.model.load import load_model, load_tokenizer
from eto_train.rollouts.kvbatch import KVBatch, SlotCache
from eto_train.rollouts.loop import Policy


def test_slot_cache_writes_in_place_at_each_rows_positions():
    """update() writes each row's new keys at its own positions of its slot, in the buffer itself
    (no copy per token), and returns the slots' keys up to span; reserve() keeps what was held."""
    g = torch.Generator().manual_seed(0)
    c = SlotCache()
    c.reserve(3, 8)
    first = torch.randn(3, 2, 4, 5, generator=g)  # 3 rows, 2 kv heads, 4 tokens, head dim 5
    c.start, c.positions, c.span = 0, torch.arange(4).expand(3, 4), 4
    k, v = c.update(first, -first, 0)
    assert torch.equal(k, first) and torch.equal(v, -first)
    buffer = c.k[0].data_ptr()
    step = torch.randn(3, 2, 1, 5, generator=g)  # one decode token per row, rows at lengths 4, 2, 3
    c.positions, c.span = torch.tensor([[4], [2], [3]]), 5
    k, _ = c.update(step, -step, 0)
    assert c.k[0].data_ptr() == buffer  # written in place
    assert torch.equal(k[0, :, 4], step[0, :, 0]) and torch.equal(k[1, :, 2], step[1, :, 0])
    assert torch.equal(k[2, :, 3], step[2, :, 0]) and torch.equal(k[0, :, :4], first[0])
    c.reserve(4, 600)  # grows: a new buffer, the old content in it
    assert c.k[0].shape == (4, 2, 600, 5) and torch.equal(c.k[0][0, :, :5], k[0])
    c.move(2, 3, 4)
    buffer_now = c.k[0].data_ptr()
    assert torch.equal(c.k[0][3, :, :4], c.k[0][2, :, :4])
    c.start, c.positions, c.span = 1, torch.tensor([[7, 8]]), 9  # one row (slot 1) alone, two tokens
    two = torch.randn(1, 2, 2, 5, generator=g)
    k, _ = c.update(two, two, 0)
    assert k.shape == (1, 2, 9, 5) and torch.equal(k[0, :, 7:9], two[0])
    c.fed, c.fed_index, c.positions = [3, 0], torch.tensor([[3], [0]]), torch.tensor([[4], [5]])  # rows by slot
    one = torch.randn(2, 2, 1, 5, generator=g)
    k, _ = c.update(one, one, 0)
    assert k.data_ptr() == buffer_now and k.shape == (4, 2, 600, 5)  # the whole buffer, for decode_attention
    assert torch.equal(k[3, :, 4], one[0, :, 0]) and torch.equal(k[0, :, 5], one[1, :, 0])


def test_kv_session_answers_what_generate_answers_on_the_whole_conversation(tiny_model_dir):
    """Two turns of three conversations through one persistent session, with a row leaving
    and a new one joining, give the tokens HF generate gives for each whole conversation."""
    tok, model = load_tokenizer(str(tiny_model_dir)), load_model(str(tiny_model_dir))
    policy = Policy(model, tok, generation(max_new_tokens=6))
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


def test_shared_prompt_prefix_is_computed_once_and_answers_do_not_change(tiny_model_dir):
    """Rows whose prompts start alike (the instruction and example of a play) copy that prefix's keys
    and values instead of computing them; the answers are generate's, over turns, with rows leaving,
    joining and moving between slots."""
    tok, model = load_tokenizer(str(tiny_model_dir)), load_model(str(tiny_model_dir))
    policy = Policy(model, tok, generation(max_new_tokens=6))
    head = [{"role": "system", "content": "Actions: go, take. " + "Read the map first. " * 12}]
    convs = [head + [{"role": "user", "content": f"Task: reach room {i}\nObservation: a hall" + " and a door" * 3 * i}]
             for i in range(4)]  # rows of different lengths: the live rows' runs are masked to each row's length
    shared, alone = policy.session(), KVBatch(model, tok, 6, policy.max_context, stop_ids=policy.stop_ids,
                                               share_prefixes=False)
    for s in (shared, alone):
        for _ in convs:
            s.add_row()
    a, b = shared.step(convs), alone.step(convs)
    assert [r[0] for r in a] == [r[0] for r in b] == [r[0] for r in policy.generate(convs)]
    prompt = sum(r[1] for r in a)
    assert shared.prefixes.shared_tokens > prompt // 2  # three of four rows copied most of their prompt
    assert shared.computed_tokens < alone.computed_tokens - shared.prefixes.shared_tokens // 2
    for c, (text, *_) in zip(convs, a):
        c += [{"role": "assistant", "content": text}, {"role": "user", "content": "You see a door."}]
    newcomer = head + [{"role": "user", "content": "Task: take the key\nObservation: a kitchen"}]
    nxt = [convs[3], convs[1], newcomer]  # rows 0 and 2 ended; row 3's slot moves into a freed one
    for s in (shared, alone):
        s.keep([3, 1])
        s.add_row()
    assert sorted(shared.slot) == [0, 1, 2]
    answers = [r[0] for r in shared.step(nxt)]
    assert answers == [r[0] for r in alone.step(nxt)] == [r[0] for r in policy.generate(nxt)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("kernel", ["c++", "cpu-flash", "matmuls"])
def test_decode_attention_over_a_shared_prefix_equals_attention_over_the_whole_slot(kernel, dtype, monkeypatch):
    """decode_attention reads the first ``shared`` positions once from the play's shared prefix and the rest from
    each row's slot: the result equals SDPA over every row's whole slot (GQA: 6 query heads on 2 key-value heads),
    masked rows included, and so does a forward of some rows by slot (each read to its own length, alone or in a
    run of adjacent slots, or in the C++ kernel); with the project's C++ kernel, torch's CPU flash kernel and the
    matmuls other devices use, in fp32 and in bf16 (to bf16's precision, the result in bf16)."""
    import types

    import torch.nn.functional as F

    from eto_train.native import decode_kernel
    from eto_train.rollouts import kvbatch

    if kernel == "matmuls":
        monkeypatch.setattr(kvbatch, "_CPU_FLASH", None)
    else:
        assert kvbatch._CPU_FLASH is not None, "this torch has no CPU flash-attention kernel"
    g = torch.Generator().manual_seed(1)
    rows, kv_heads, heads, d, span, shared = 3, 2, 6, 8, 20, 7
    k, v = torch.randn(rows, kv_heads, span, d, generator=g), torch.randn(rows, kv_heads, span, d, generator=g)
    prefix_k, prefix_v = torch.randn(kv_heads, shared + 3, d, generator=g), torch.randn(kv_heads, shared + 3, d,
                                                                                        generator=g)
    k[:, :, :shared], v[:, :, :shared] = prefix_k[:, :shared], prefix_v[:, :shared]  # every slot holds the prefix
    q = torch.randn(rows, heads, 1, d, generator=g)
    lengths = torch.tensor([20, 15, 9])  # each row's positions; the others are masked
    mask = (torch.arange(span)[None, :] < lengths[:, None])[:, None, None, :]
    expected = F.scaled_dot_product_attention(q, k.repeat_interleave(3, dim=1), v.repeat_interleave(3, dim=1),
                                              attn_mask=mask, scale=0.3).transpose(1, 2)
    q, k, v, prefix_k, prefix_v = (t.to(dtype) for t in (q, k, v, prefix_k, prefix_v))
    module = types.SimpleNamespace(layer_idx=0)
    built = decode_kernel.load() if kernel == "c++" else None
    assert kernel != "c++" or built is not None, "the C++ kernel was not built (a C++ compiler and ninja are needed)"
    cache = types.SimpleNamespace(shared=shared, shared_kv=[(prefix_k, prefix_v)], fed=None, fed_lengths=None,
                                  kernel=built)

    def feed(slots, lengths):  # as KVBatch._run sets them for a decode step of these slots
        cache.fed, cache.fed_lengths = slots, lengths
        cache.fed_index, cache.fed_ends = torch.tensor(slots)[:, None], torch.tensor(lengths)
        cache.fed_runs = None if built is not None else kvbatch._runs(slots, lengths, shared)

    kvbatch._forward.cache = cache
    try:
        got, _ = kvbatch.decode_attention(module, q, k, v, mask, scaling=0.3)
        # rows fed by slot (the live rows of a decode step): whole buffers, each row read to its own length;
        # slots 2 and 0 (two runs, unmasked), then slots 0-2 (one run, masked to each row's length)
        feed([2, 0], [9, 20])
        by_slot, _ = kvbatch.decode_attention(module, q[[2, 0]], k, v, None, scaling=0.3)
        feed([0, 1, 2], [20, 15, 9])
        assert built is not None or (len(cache.fed_runs) == 1 and cache.fed_runs[0][4] is not None)
        one_run, _ = kvbatch.decode_attention(module, q, k, v, None, scaling=0.3)
        cache.shared, cache.fed, cache.fed_lengths = 0, None, None  # no shared prefix: over the slots alone
        plain, _ = kvbatch.decode_attention(module, q, k, v, mask, scaling=0.3)
    finally:
        kvbatch._forward.cache = None
    atol = 1e-6 if dtype == torch.float32 else 2e-2
    assert got.dtype == plain.dtype == by_slot.dtype == dtype
    assert torch.allclose(got.float(), expected, atol=atol) and torch.allclose(plain.float(), expected, atol=atol)
    assert torch.allclose(by_slot.float(), expected[[2, 0]], atol=atol)
    assert torch.allclose(one_run.float(), expected, atol=atol)


def test_a_decode_step_feeds_only_the_rows_still_answering(tiny_model_dir):
    """Rows whose answer ended are not fed while the others decode: the answers, over two turns with rows
    ending at different lengths, equal HF generate's (with the same stop tokens), those of the engine's
    every-row path (the model's own attention over contiguous slots) and those of the live rows read through
    torch's kernel instead of the C++ one, and the decode steps fed only the tokens the live rows generated."""
    tok, model = load_tokenizer(str(tiny_model_dir)), load_model(str(tiny_model_dir))
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():  # weights that answer each prompt differently (the fixture's repeat one token)
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.5)
    policy = Policy(model, tok, generation(max_new_tokens=8))
    head = [{"role": "system", "content": "Actions: go, take. " + "Read the map first. " * 12}]
    convs = [head + [{"role": "user", "content": f"Task: reach room {i}\nObservation: a hall" + " and a door" * 3 * i}]
             for i in range(4)]  # rows of different lengths: the live rows' runs are masked to each row's length
    probe = policy.session()
    for _ in convs:
        probe.add_row()
    seen = []  # the tokens the session picks, a list per decode step
    pick = probe._pick
    probe._pick = lambda logits: seen.append(pick(logits).tolist()) or torch.tensor(seen[-1])
    probe.step(convs)
    ids = [list(t) for t in zip(*seen)]
    # a stop token that ends one answer early and not the others, so that rows end at different steps
    stop = next(t for a in ids for t in a[1:4] if sum(t in b for b in ids) == 1)
    policy.stop_ids = list(policy.stop_ids) + [stop]
    live, every = policy.session(), policy.session()
    every._decode_attention = False  # the every-row path: the model's own attention, a mask, contiguous slots
    runs = KVBatch(model, tok, policy.gen.max_new_tokens, policy.max_context, encode_full=policy._encode,
                   stop_ids=policy.stop_ids, decode_kernel=False)  # the live rows in runs, through torch's kernel
    assert live.cache.kernel is not None and runs.cache.kernel is None
    for s in (live, every, runs):
        for _ in convs:
            s.add_row()
    for turn in range(2):
        a, b = live.step(convs), every.step(convs)
        assert [r[0] for r in a] == [r[0] for r in b] == [r[0] for r in runs.step(convs)]
        assert [r[0] for r in a] == [r[0] for r in policy.generate(convs)]
        assert len({r[2] for r in a}) > 1 or turn  # the first turn's answers end at different lengths
        for c, (text, *_) in zip(convs, a):
            c += [{"role": "assistant", "content": text}, {"role": "user", "content": "You see a door."}]
    assert live.stats["decode_steps"] == every.stats["decode_steps"]
    assert live.computed_tokens - live.stats["prefill_tokens"] == live.stats["decode_tokens"]
    assert live.computed_tokens < every.computed_tokens  # the ended rows were fed on the every-row path


def test_a_decode_steps_rows_go_in_runs_of_adjacent_slots_of_similar_lengths(monkeypatch):
    """Hand-computed: slots 0, 1, 2, 5, 6 fed, lengths 10, 12, 300, 11, 11, 4 positions shared, a spread of 256:
    slots 0-1 in one run masked to their lengths, slot 2 alone (288 positions longer), slots 5-6 (not adjacent
    to 2) in one run, unmasked (equal lengths)."""
    from eto_train.rollouts import kvbatch

    monkeypatch.setattr(kvbatch, "RUN_SPREAD", 256)
    runs = kvbatch._runs([0, 1, 2, 5, 6], [10, 12, 300, 11, 11], 4)
    assert [r[:4] for r in runs] == [(0, 2, 0, 12), (2, 3, 2, 300), (3, 5, 5, 11)]
    assert runs[1][4] is None and runs[2][4] is None
    assert runs[0][4].shape == (2, 1, 1, 8)  # positions 4..11
    assert runs[0][4][:, 0, 0].tolist() == [[True] * 6 + [False] * 2, [True] * 8]
    monkeypatch.setattr(kvbatch, "RUN_SPREAD", 300)
    assert [r[:2] for r in kvbatch._runs([0, 1, 2, 5, 6], [10, 12, 300, 11, 11], 4)] == [(0, 3), (3, 5)]


def test_a_packed_prefill_gives_each_row_what_its_own_prefill_gives(tiny_model_dir):
    """Several rows' chunks fed in one packed sequence (each at its row's positions, over its own slot,
    causally) leave the same keys and values in each slot and give the same last logits as each chunk fed
    alone; with more tokens than one packed forward takes, in several."""
    from eto_train.rollouts import kvbatch

    tok, model = load_tokenizer(str(tiny_model_dir)), load_model(str(tiny_model_dir))
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.5)
    heads = [torch.randint(5, 300, (n,), generator=g).tolist() for n in (9, 4, 17)]  # what each slot holds already
    chunks = [torch.randint(5, 300, (n,), generator=g).tolist() for n in (5, 12, 1)]
    sessions = []
    for _ in range(2):
        s = KVBatch(model, tok, 4, 1024)
        for i, h in enumerate(heads):
            s.add_row()
            with torch.inference_mode():
                s._prefill(i, h)
        sessions.append(s)
    packed, alone = sessions
    with torch.inference_mode():
        got = packed._prefill_packed(list(enumerate(chunks)))
        want = [alone._prefill(i, c) for i, c in enumerate(chunks)]
        with pytest.MonkeyPatch.context() as mp:  # a limit under the three chunks' 18 tokens: two forwards
            mp.setattr(kvbatch, "PACK_TOKENS", 13)
            split = KVBatch(model, tok, 4, 1024)
            for i, h in enumerate(heads):
                split.add_row()
                split._prefill(i, h)
            twice = split._prefill_packed(list(enumerate(chunks)))
    assert all(torch.allclose(a, b, atol=1e-5) for a, b in zip(got, want))
    assert all(torch.allclose(a, b, atol=1e-5) for a, b in zip(twice, want))
    assert packed.length == alone.length == [14, 16, 18]
    for layer in range(len(alone.cache.k)):
        for slot, n in enumerate(alone.length):
            assert torch.allclose(packed.cache.k[layer][slot, :, :n], alone.cache.k[layer][slot, :, :n], atol=1e-5)
            assert torch.allclose(packed.cache.v[layer][slot, :, :n], alone.cache.v[layer][slot, :, :n], atol=1e-5)
    assert packed.stats["prefill_tokens"] == alone.stats["prefill_tokens"]
