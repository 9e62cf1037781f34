"""The offline tiny base model: no download, everything built from the project's own data.

A byte-level BPE tokenizer trained on the expert trajectories' text, a small Llama config and
a ChatML chat template. Its assistant turns sit inside ``{% generation %}`` markers, which
training does not need (training/masks.py works on any template); the tests compare the
template's own assistant mask with ours.

Written by hand because no library builds a from-scratch chat model for offline use; each
piece is a standard ``tokenizers``/``transformers`` object saved with ``save_pretrained``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterable

IM_START, IM_END, PAD = "<|im_start|>", "<|im_end|>", "<|pad|>"

# ChatML. Only the assistant content and its closing <|im_end|> are inside the generation
# block: that is exactly what the model must learn to produce (the header is prompt).
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if message['role'] == 'assistant' %}"
    "{{ '<|im_start|>assistant\n' }}"
    "{% generation %}{{ message['content'] + '<|im_end|>' }}{% endgeneration %}"
    "{{ '\n' }}"
    "{% else %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def train_tokenizer(texts: Iterable[str], vocab_size: int, min_frequency: int = 2):
    """Train a byte-level BPE on ``texts`` and wrap it as a transformers fast tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    # Digits one by one: quantities and sums stay comparable digit-wise for a tiny model.
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, min_frequency=min_frequency,
        special_tokens=[PAD, IM_START, IM_END],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer=trainer)
    hf = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=IM_START, eos_token=IM_END,
                                 pad_token=PAD, padding_side="left")
    hf.chat_template = CHAT_TEMPLATE
    return hf


def build_tiny_model(tokenizer, hidden_size: int, num_layers: int, num_heads: int,
                     intermediate_size: int, max_position_embeddings: int, seed: int):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=hidden_size, intermediate_size=intermediate_size,
        num_hidden_layers=num_layers, num_attention_heads=num_heads, num_key_value_heads=num_heads,
        max_position_embeddings=max_position_embeddings, tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id, rms_norm_eps=1e-5)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    return model


def save(model, tokenizer, out_dir: str | Path) -> None:
    out_dir = Path(out_dir)
    model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)
