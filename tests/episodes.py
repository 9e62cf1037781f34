"""Episodes as the rollout tests compare them (tests/test_env_workers.py, tests/test_faults.py)."""

from __future__ import annotations


def untimed(eps) -> list[dict]:
    """The episodes' records by episode id, each step's wall-clock times (``latency_s``, ``env_s``) set to 0."""
    out = []
    for e in eps:
        d = e.to_dict()
        d["steps"] = [{**st, "latency_s": 0, "env_s": 0} for st in d["steps"]]
        out.append(d)
    return sorted(out, key=lambda d: d["episode_id"])
