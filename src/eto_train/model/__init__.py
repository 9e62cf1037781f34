"""Models: the offline tiny base model and loading of any policy checkpoint."""

# Architectures whose attention is plain causal scaled dot-product (no soft-capping, sinks, position biases):
# the rollout engine's decode attention (rollouts/kvbatch.py) and the trainers' packed rows
# (training/right_padding.py) compute theirs by hand for these only; any other keeps its own
PLAIN_ATTENTION = frozenset({"llama", "mistral", "qwen2", "qwen3"})


def sliding_window(config) -> bool:
    """Whether some layer of this model attends within a window (Mistral v0.1, Gemma, Qwen2 with it on)."""
    window = getattr(config, "sliding_window", None) and getattr(config, "use_sliding_window", True)
    return bool(window) or any(t != "full_attention" for t in (getattr(config, "layer_types", None) or ()))

