"""Loading a policy (the tiny model's folder, any local checkpoint or a Hugging Face id)."""

from __future__ import annotations

import json
import os
import re
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ..records import PolicyRef
from ..store import identity_sha256


class CheckpointError(FileNotFoundError):
    """A checkpoint that is missing or unreadable; the message names the path."""


def weights_sha256(path: str | Path, full: bool = False) -> str:
    """Content hash of a checkpoint's weight files (safetensors only: each file's name, then its bytes).

    Kept in the checkpoint's ``.identity.json`` once computed and answered from there while the
    weight files' sizes and mtimes are unchanged (no 13 GB re-read per check of a 7B model);
    ``full=True`` or ETO_TRAIN_FULL_HASH=1 re-hashes every byte (see ``store.identity_sha256``)."""
    path = Path(path)
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise CheckpointError(f"{path}: no *.safetensors weights found")
    return identity_sha256(path, "weights_sha256", files, full=full)


def policy_ref(path_or_id: str, name: str | None = None, full: bool = False) -> PolicyRef:
    """The policy's identity; a local folder is checked whole first (:func:`check_checkpoint`)
    and coherent (:func:`check_coherence`): every stage that plays or compares a policy asks for
    its identity before it writes anything (a folder with no tokenizer file, as the identity
    tests' bare weights, is only hashed: loading it names what is missing)."""
    check_checkpoint(path_or_id)
    p = Path(path_or_id)
    if p.is_dir():
        if any((p / n).exists() for n in TOKENIZER_FILES):
            check_coherence(p)
        sha = weights_sha256(p, full=full)
        return PolicyRef(id=f"{name or p.name}@{sha[:12]}", path=str(p), weights_sha256=sha)
    return PolicyRef(id=f"{path_or_id}@hub", path=str(path_or_id), weights_sha256="")


def is_local(path_or_id: str) -> bool:
    """A local folder, as opposed to a hub id such as ``org/name`` or ``gpt2``."""
    s = str(path_or_id)
    return Path(s).exists() or s.startswith(("/", ".", "~")) or s.count("/") >= 2


def hub_offline() -> bool:
    """Whether the Hugging Face hub may not be reached (HF_HUB_OFFLINE=1: the Makefile and
    ``setup_runtime`` set it), read from the environment as well as from huggingface_hub (whose
    constant is fixed when it is imported)."""
    from huggingface_hub import constants

    env = os.environ.get("HF_HUB_OFFLINE") or os.environ.get("TRANSFORMERS_OFFLINE") or ""
    return bool(constants.HF_HUB_OFFLINE) or env.strip().upper() in {"1", "ON", "YES", "TRUE"}


def in_hub_cache(repo_id: str) -> bool:
    """Whether the local Hugging Face cache holds ``repo_id`` (its config or tokenizer config);
    looks at files only, never at the network."""
    from huggingface_hub import try_to_load_from_cache

    for name in ("config.json", "tokenizer_config.json"):
        try:
            if isinstance(try_to_load_from_cache(repo_id, name), str):
                return True
        except Exception:  # not a valid repo id at all
            return False
    return False


def how_to_get(path_or_id: str) -> str:
    """The remedy for a policy that is neither a local folder nor loadable offline."""
    return (f"If it is a hub id (check its spelling), download the weights on a machine with internet: "
            f"`hf download {path_or_id}` (`huggingface-cli download {path_or_id}` with huggingface_hub < 1.0) "
            f"and copy the Hugging Face cache or the model folder here; or point model.path / eval.policy "
            f"at a local checkpoint folder")


def check_checkpoint(path_or_id: str) -> None:
    """A clear error for a local checkpoint that is missing or not a model folder, and for a hub
    id that cannot be loaded offline (neither a local folder nor in the Hugging Face cache)."""
    if not is_local(path_or_id):
        if hub_offline() and not in_hub_cache(path_or_id):
            from huggingface_hub import constants

            raise CheckpointError(
                f"{path_or_id}: not a local folder, and not in the Hugging Face cache ({constants.HF_HUB_CACHE}); "
                f"HF_HUB_OFFLINE=1 (the Makefile sets it), so nothing is downloaded. {how_to_get(path_or_id)}")
        return
    p = Path(path_or_id).expanduser()
    if not p.is_dir():
        raise CheckpointError(f"{p}: checkpoint folder not found (run the stage that writes it first)")
    if not (p / "config.json").exists():
        raise CheckpointError(f"{p}: not a model folder (no config.json)")
    if not list(p.glob("*.safetensors")):
        raise CheckpointError(f"{p}: no *.safetensors weights (only safetensors are loaded)")
    for f in sorted(p.glob("*.safetensors")):
        _check_safetensors(f)
    check_json_files(p)


def check_json_files(path: str | Path) -> None:
    """The JSON files of a local checkpoint folder (:data:`JSON_FILES`), each parsed whole: a damaged
    one is a :class:`CheckpointError` naming the file, line and column (a path that is not a folder: nothing)."""
    p = Path(str(path)).expanduser()
    if not p.is_dir():
        return
    for name in JSON_FILES:
        if (p / name).is_file():
            _check_json(p / name)


# the JSON files of a checkpoint folder that transformers reads (a damaged one was a bare JSONDecodeError)
JSON_FILES = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
              "special_tokens_map.json", "added_tokens.json")
_JSON_OK: set[tuple[str, int, int]] = set()  # (path, size, mtime) of the files read whole in this process


def _check_json(f: Path) -> None:
    """A clear error for a checkpoint's JSON file that is not valid JSON (damaged, cut short, hand
    edited): the file, the line and the column, before anything is loaded or written. Each file is
    parsed once per process while its size and mtime are unchanged."""
    st = f.stat()
    key = (str(f.resolve()), st.st_size, st.st_mtime_ns)
    if key in _JSON_OK:
        return
    data = f.read_bytes()
    try:
        text = data.decode("utf-8")
        json.loads(text)
    except UnicodeDecodeError as exc:
        why = f"not valid UTF-8 at byte {exc.start}"
    except json.JSONDecodeError as exc:
        cut = exc.pos >= len(text.rstrip()) or exc.msg.startswith("Unterminated string")
        why = f"not valid JSON at line {exc.lineno} column {exc.colno}: {exc.msg}" + (" (cut short?)" if cut else "")
    else:
        _JSON_OK.add(key)
        return
    from ..layout import rebuild_hint

    hint = rebuild_hint(f.parent)
    todo = f"{hint} to rebuild it" if hint else "restore it from where the checkpoint came from"
    raise CheckpointError(f"{f}: {why}; the checkpoint cannot be loaded. Nothing was run or written: {todo}")


def _check_safetensors(f: Path) -> None:
    """A clear error for a weights file that is not a whole safetensors file (garbage, cut short).

    Reads the header only (the tensors are memory-mapped, not loaded)."""
    from safetensors import safe_open

    try:
        with safe_open(str(f), framework="pt") as fh:
            fh.keys()
    except Exception as exc:
        from ..layout import rebuild_hint  # e.g. "Re-run `make bc` (stage bc)": that rerun redoes it

        hint = rebuild_hint(f.parent)
        todo = f"{hint} to rebuild it" if hint else "re-run the stage that wrote this checkpoint"
        raise CheckpointError(f"{f}: corrupt safetensors weights ({exc}); {todo}") from None


def load_tokenizer(path_or_id: str, trust_remote_code: bool = False, chat_template: str | None = None):
    """``chat_template`` replaces the checkpoint's (``model.chat_template``): the saved policy
    then carries it to every later stage."""
    check_checkpoint(path_or_id)
    from transformers import AutoTokenizer

    with _naming(path_or_id):
        tok = AutoTokenizer.from_pretrained(path_or_id, trust_remote_code=trust_remote_code)
    if chat_template:
        tok.chat_template = chat_template
    if is_local(path_or_id):
        check_coherence(path_or_id, tok)
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    tok.padding_side = "left"
    return tok


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")
_EMBEDDING = re.compile(r"(?:^|\.)(?:embed_tokens|wte|embed_in|word_embeddings)\.weight$")


def embedding_rows(path: str | Path) -> tuple[int, str]:
    """The input embedding's row count of a local checkpoint and where it was read: the
    safetensors header of its embedding tensor (no weights are loaded), else config.json's
    ``vocab_size`` (its ``text_config``'s for multimodal configs)."""
    from safetensors import safe_open

    path = Path(path)
    for f in sorted(path.glob("*.safetensors")):
        with safe_open(str(f), framework="pt") as fh:
            for key in fh.keys():
                if _EMBEDDING.search(key):
                    return int(fh.get_slice(key).get_shape()[0]), f"{key} in {f.name}"
    cfg = json.loads((path / "config.json").read_text())
    vocab = cfg.get("vocab_size") or (cfg.get("text_config") or {}).get("vocab_size")
    if not isinstance(vocab, int):
        raise CheckpointError(f"{path}: no embedding tensor in its safetensors and no vocab_size in config.json")
    return vocab, "config.json vocab_size"


def _special_ids(tok) -> dict[str, int]:
    """Named special-token ids (bos, eos, pad, unk, the extra special tokens) and the added
    tokens the chat template writes (its end-of-turn marks: ``<|im_end|>``, ``<|eot_id|>``, ...)."""
    ids = {}
    for name in ("bos_token", "eos_token", "pad_token", "unk_token"):
        tid = getattr(tok, f"{name}_id", None)
        if isinstance(tid, int):
            ids[f"{name} {getattr(tok, name)!r}"] = tid
    for t, tid in zip(tok.all_special_tokens, tok.all_special_ids):
        ids.setdefault(f"special token {t!r}", tid)
    template = tok.chat_template if isinstance(tok.chat_template, str) else ""
    for t, tid in tok.get_added_vocab().items():
        if t and t in template:
            ids.setdefault(f"chat-template token {t!r}", tid)
    return ids


def check_coherence(path: str | Path, tok=None) -> None:
    """A policy folder whose tokenizer and weights do not belong together is refused, naming the
    folder and both numbers: more tokens than the embedding has rows (the extra ids would index
    past it: an IndexError on CPU, a device-side assert or silent garbage on GPU), a special or
    chat-template token whose id falls outside it, or no chat template at all (every prompt and
    training mask is built with it; ``model.chat_template`` supplies one to a training stage).
    The embedding's size is read from the safetensors header; ``tok`` is loaded when not given.
    Fewer tokens than rows is normal (embeddings padded to a multiple of 64 or 128)."""
    path = Path(path)
    if tok is None:
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(str(path))
    rows, where = embedding_rows(path)
    n = len(tok)
    if n > rows:
        raise CheckpointError(
            f"{path}: the tokenizer has {n} tokens but the embedding has {rows} rows ({where}); token ids "
            f"{rows}..{n - 1} would index past it. Use the tokenizer saved with these weights, or resize the "
            f"embedding (model.resize_token_embeddings(len(tokenizer))) and save both")
    outside = {k: v for k, v in _special_ids(tok).items() if not 0 <= v < rows}
    if outside:
        listed = ", ".join(f"{k} = id {v}" for k, v in outside.items())
        raise CheckpointError(f"{path}: {listed}: outside the embedding's {rows} rows ({where}); the tokenizer "
                              f"({n} tokens) does not belong to these weights")
    if not tok.chat_template:
        raise CheckpointError(f"{path}: the tokenizer has no chat template (tokenizer_config.json / "
                              f"chat_template.jinja); prompts are built with it. Set model.chat_template, or save "
                              f"the policy with its template")


@contextmanager
def _naming(path_or_id: str):
    """A hub id that the hub did not give (a mistyped id, no connection, a gated model): an
    error that names it and says how to get the weights, instead of the hub's bare message."""
    try:
        yield
    except CheckpointError:
        raise
    except OSError as exc:
        if is_local(path_or_id):
            raise
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise CheckpointError(f"{path_or_id}: not a local folder, and the Hugging Face hub did not give it "
                              f"({first}). {how_to_get(path_or_id)}") from exc


def bnb_kwargs(quantization: dict[str, Any], dtype: str) -> dict[str, Any]:
    """``model.quantization`` (BitsAndBytesConfig keywords) with torch dtypes filled in.

    The compute dtype defaults to the model's (bfloat16 on GPU configs): QLoRA stores the base
    weights in 4 bits and computes in 16.
    """
    import torch

    kw = dict(quantization)
    kw.setdefault("bnb_4bit_compute_dtype", dtype)
    for k in ("bnb_4bit_compute_dtype", "bnb_4bit_quant_storage"):
        if isinstance(kw.get(k), str):
            kw[k] = getattr(torch, kw[k])
    return kw


def check_quantization(quantization: dict[str, Any] | None) -> None:
    """A clear error, before a stage touches anything, for QLoRA where it cannot run.

    On a CUDA GPU it needs bitsandbytes; on a CPU, bitsandbytes' CPU backend (bitsandbytes
    0.50.2 was tested here: nf4 load, LoRA forward, backward and AdamW step run on torch 2.13's CPU
    build; its 4-bit kernels are registered in ``bitsandbytes/backends/cpu/ops.py``). The CPU
    check asks the library itself: a 4-bit quantization of a small tensor on the CPU."""
    if not quantization:
        return
    from ..distributed import local_device

    on_gpu = local_device().startswith("cuda")
    try:
        import bitsandbytes  # noqa: F401
    except ImportError as exc:
        if not on_gpu:
            raise RuntimeError("model.quantization (bitsandbytes 4-bit, QLoRA) needs a CUDA GPU, or bitsandbytes "
                               "with its CPU backend on a CPU (pip install -e '.[gpu]'); or set "
                               "model.quantization=null") from exc
        raise ImportError("model.quantization needs bitsandbytes: pip install -e '.[gpu]'") from exc
    if not on_gpu:
        import torch
        from bitsandbytes.functional import quantize_4bit

        try:
            quantize_4bit(torch.ones(64, dtype=torch.bfloat16), blocksize=64, quant_type="nf4")
        except Exception as exc:  # noqa: BLE001 - any failure of the library's CPU op is the same verdict
            raise RuntimeError(f"model.quantization (bitsandbytes 4-bit, QLoRA) needs a CUDA GPU, or a bitsandbytes "
                               f"whose CPU backend quantizes to 4 bits (bitsandbytes {bitsandbytes.__version__} "
                               f"here: {type(exc).__name__}: {exc}); set model.quantization=null on this "
                               f"CPU") from None


def model_kwargs(model_cfg: dict[str, Any]) -> dict[str, Any]:
    """``from_pretrained`` keywords the ``model`` section sets beyond dtype and quantization
    (``model.attn_implementation``), for every load of a policy or reference for training."""
    return {"attn_implementation": model_cfg["attn_implementation"]} if model_cfg.get("attn_implementation") else {}


def train_dtype(model_cfg: dict[str, Any]) -> str:
    """The dtype a training stage loads the policy in, from the ``model`` section.

    Full fine-tuning: float32 whatever ``model.dtype`` is. The loaded weights are the optimizer's
    (master) weights and ``bf16: true`` in the trainer only turns on autocast (bf16 compute);
    weights held in bf16 would lose every update under half a bf16 step (about 6e-5 near 0.02,
    more than a step at lr 1e-6..2e-5). LoRA / QLoRA: ``model.dtype`` for the frozen base (or its
    4-bit compute dtype); the adapters are held in float32 (:func:`fp32_trainable`).
    Rollouts and the saved policy keep ``model.dtype``."""
    return model_cfg["dtype"] if model_cfg.get("lora") else "float32"


def fp32_trainable(model) -> int:
    """Hold every trainable parameter in float32 (the optimizer's master weights); returns how
    many tensors were cast. Call it on the trainer's model before training starts (the optimizer
    is created in ``train()``).

    PEFT already creates LoRA adapters in float32 over a 16-bit base (``get_peft_model(...,
    autocast_adapter_dtype=True)``, peft/mapping_func.py:110, peft/tuners/tuners_utils.py:2705),
    but TRL 1.16 casts the adapters of a quantized (QLoRA) base back to bf16
    (trl/trainer/sft_trainer.py:908-911, trl/trainer/dpo_trainer.py:726-729), where an adapter
    update at lr 1e-5 is below half a bf16 step. Under DeepSpeed ZeRO-3 TRL keeps bf16 adapters
    on purpose (sft_trainer.py:856-857, dpo_trainer.py:650-651) and DeepSpeed keeps its own fp32 masters,
    so the caller skips this there; FSDP2 upcasts trainable parameters itself
    (accelerate/utils/fsdp_utils.py:816-820)."""
    import torch

    cast = 0
    for p in model.parameters():
        if p.requires_grad and p.is_floating_point() and p.dtype != torch.float32:
            p.data = p.data.float()
            cast += 1
    return cast


def load_model(path_or_id: str, dtype: str = "float32", trust_remote_code: bool = False,
               device: str = "cpu", quantization: dict[str, Any] | None = None, **kwargs: Any):
    """A causal LM on ``device`` ("auto": this process's GPU, else cpu).

    With ``quantization`` (e.g. ``{load_in_4bit: true, bnb_4bit_quant_type: nf4}``) the weights
    are loaded by bitsandbytes straight onto this process's GPU (4-bit weights cannot move).
    """
    check_checkpoint(path_or_id)
    import torch
    from transformers import AutoModelForCausalLM

    from ..distributed import local_device

    if device == "auto":
        device = local_device()
    if quantization:
        check_quantization(quantization)
        device = local_device()
        from transformers import BitsAndBytesConfig

        kwargs.update(quantization_config=BitsAndBytesConfig(**bnb_kwargs(quantization, dtype)),
                      device_map={"": device})
    with _naming(path_or_id):
        model = AutoModelForCausalLM.from_pretrained(
            path_or_id, dtype=getattr(torch, dtype), trust_remote_code=trust_remote_code,
            use_safetensors=True, **kwargs)
    return model if quantization else model.to(device)
