"""Episodes per second of ``env=agentgym`` against a loopback AgentGym-protocol server
(tests/agentgym_server.py, WebShop's protocol, every answer delayed by ``--delay`` s as a simulator
would be), at 1 / 8 / 64 parallel episodes (threads sharing the process's connection pool) and
``env.max_connections`` 4 vs 16. An episode: create, reset, GET /observation, 3 steps (the gold path).

``python lab/bench_agentgym.py [--episodes 64] [--delay 0.01]``: prints a JSON line per setting.
"""

from __future__ import annotations

import argparse
import json
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "src"), str(ROOT / "tests")]

from eto_train.envs.agentgym import AgentGymEnv, AgentGymTask  # noqa: E402


def serve(delay: float) -> tuple[subprocess.Popen, str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, str(ROOT / "tests" / "agentgym_server.py"), str(port), "webshop",
                             "--delay", str(delay)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(600):
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return proc, f"http://127.0.0.1:{port}"
        time.sleep(0.05)
    proc.kill()
    raise RuntimeError("the AgentGym test server did not start")


def episodes_per_s(url: str, parallel: int, max_connections: int, episodes: int) -> float:
    def play(idx: int) -> bool:
        env = AgentGymEnv(url=url, env_name="webshop", max_connections=max_connections)
        try:
            env.reset(AgentGymTask("agentgym", "webshop", "bench", idx, "bench"))
            path = ["go", "wait", "go"] if idx % 2 else ["go", "go", "go"]
            return [env.step(a) for a in path][-1].success
        finally:
            env.close()

    start = time.perf_counter()
    with ThreadPoolExecutor(parallel) as pool:
        won = list(pool.map(play, range(episodes)))
    took = time.perf_counter() - start
    assert len(won) == episodes and all(won)
    return episodes / took


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--episodes", type=int, default=64)
    ap.add_argument("--delay", type=float, default=0.01)
    args = ap.parse_args()
    proc, url = serve(args.delay)
    try:
        for conns in (4, 16):
            for parallel in (1, 8, 64):
                rate = episodes_per_s(url, parallel, conns, args.episodes)
                print(json.dumps({"parallel": parallel, "max_connections": conns, "episodes": args.episodes,
                                  "delay_s": args.delay, "episodes_per_s": round(rate, 1)}), flush=True)
    finally:
        proc.kill()


if __name__ == "__main__":
    main()
