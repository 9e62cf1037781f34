"""Small random-init models around the *real* tokenizer files and chat templates of public
chat-model families, for tests and the CPU rehearsal of every experiment config.

The tokenizer files are vendored, compressed, in ``tests/data/tokenizers/<family>/`` (sources
and licenses in its NOTICE.md): nothing is downloaded. The builder lives with its data in tests/
(the package reads nothing of tests/); scripts that build a fixture (determinism, gpu_smoke,
rehearse_vllm) put tests/ on their path. A fixture model is the family's own
architecture (Llama, Mistral, Qwen2, Qwen3, Gemma-3) at toy size, so that what a GPU user meets
first (no pad token, several end-of-turn ids, templates without generation markers, history
rewriting, strict role alternation, sliding-window attention) is met here first.
"""

from __future__ import annotations

import json
import lzma
import shutil
from dataclasses import dataclass
from pathlib import Path

TOKENIZERS = Path(__file__).resolve().parent / "data" / "tokenizers"


@dataclass(frozen=True)
class Family:
    name: str
    arch: str                   # the transformers config class of the family's architecture
    model_config: str           # the configs/model/<name>.yaml a user runs with this family
    kv_heads: int = 2           # grouped-query attention, as the family's models (Llama-2-7B: none)
    extra: tuple = ()           # further config keywords of the architecture


FAMILIES = {f.name: f for f in (
    Family("llama2", "LlamaConfig", "llama2_7b_chat", kv_heads=4),
    Family("llama3", "LlamaConfig", "llama3_8b_instruct"),
    Family("mistral", "MistralConfig", "mistral_7b_instruct", extra=(("sliding_window", None),)),
    Family("qwen2_5", "Qwen2Config", "qwen2_5_7b_instruct"),
    Family("qwen3", "Qwen3Config", "qwen3_8b"),
    # Gemma-3 1B alternates sliding-window (512 tokens) and global attention layers
    Family("gemma3", "Gemma3TextConfig", "gemma3_1b_it",
           extra=(("sliding_window", 512), ("layer_types", ["sliding_attention", "full_attention"]))),
    # SmolLM2-135M-Instruct (the project's real CPU model, configs/model/smollm2_135m.yaml): ChatML whose
    # eos <|im_end|> is also the pad token, and a template that adds its own system turn when there is none
    Family("smollm2", "LlamaConfig", "smollm2_135m"),
)}


def tiny_model(texts: list[str], out: Path, vocab_size: int, num_layers: int, max_position_embeddings: int) -> Path:
    """The package's own offline tiny model (eto_train.model.tiny: a BPE trained on ``texts``, ChatML, a Llama of
    hidden size 32, two heads, MLP 64, seed 0) saved in ``out``."""
    from eto_train.model.tiny import build_tiny_model, save, train_tokenizer

    tok = train_tokenizer(texts, vocab_size=vocab_size, min_frequency=1)
    model = build_tiny_model(tok, hidden_size=32, num_layers=num_layers, num_heads=2, intermediate_size=64,
                             max_position_embeddings=max_position_embeddings, seed=0)
    save(model, tok, out)
    return out


def build_fixture_model(family: str, out: str | Path, hidden_size: int = 32, num_layers: int = 2,
                        num_heads: int = 4, intermediate_size: int = 64, max_position_embeddings: int = 4096,
                        seed: int = 0, source: str | Path = TOKENIZERS) -> Path:
    """Write a checkpoint folder (random weights, the family's real tokenizer) to ``out``."""
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    if family not in FAMILIES:
        raise ValueError(f"unknown model family {family!r}; known: {', '.join(FAMILIES)}")
    fam, out, src = FAMILIES[family], Path(out), Path(source) / family
    out.mkdir(parents=True, exist_ok=True)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (out / name).write_bytes(lzma.decompress((src / f"{name}.xz").read_bytes()))
    shutil.copy(src / "generation_config.json", out / "generation_config.json")
    tok = AutoTokenizer.from_pretrained(out)
    gen = json.loads((src / "generation_config.json").read_text())
    config = getattr(transformers, fam.arch)(
        vocab_size=len(tok), hidden_size=hidden_size, intermediate_size=intermediate_size,
        num_hidden_layers=num_layers, num_attention_heads=num_heads, num_key_value_heads=fam.kv_heads,
        head_dim=hidden_size // num_heads, max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=True, bos_token_id=gen.get("bos_token_id"), eos_token_id=gen["eos_token_id"],
        pad_token_id=tok.pad_token_id, **dict(fam.extra))
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config)
    model.generation_config = GenerationConfig(**gen)
    model.save_pretrained(out, safe_serialization=True)
    return out
