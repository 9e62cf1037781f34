"""A text game behind AgentGym's env-server protocol, for tests/test_agentgym.py and the benchmark
(lab/bench_agentgym.py): the goal game of tests/goal_env.py (three 'go' in a row win; on odd
task indices 'go', 'wait', 'go'), served the way AgentGym's WebShop, ALFWorld or SciWorld server
names things (envs/agentgym.py's PROTOCOLS: the /create answer, the id key, reset's index key,
the observation and score fields). The standard library's threaded HTTP server, one thread a request.

``python tests/agentgym_server.py <port> <webshop|alfworld|sciworld> [<trigger file>] [--delay S]
[--drop-every N]``: while the trigger file holds ``index:step``, the process exits (status 17)
when that step of that task arrives, and removes the file (a server killed mid-episode);
``--delay``: every answer waits S seconds (a slow server); ``--drop-every``: every Nth /step
request's connection is closed unanswered, before the step is played (a dropped connection).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse


def gold(idx: int) -> list[str]:
    return ["go", "wait", "go"] if idx % 2 else ["go", "go", "go"]


class Game:
    def __init__(self) -> None:
        self.idx, self.t, self.progress = 0, 0, 0

    def reset(self, idx: int) -> None:
        self.idx, self.t, self.progress = idx, 0, 0

    def step(self, action: str) -> tuple[str, float, bool]:
        self.t += 1
        path = gold(self.idx)
        if self.progress == self.t - 1 and self.progress < len(path) and action == path[self.progress]:
            self.progress += 1
        return f"step {self.t}", self.progress / len(path), self.progress == len(path)


ARGS: argparse.Namespace
GAMES: dict[int, Game] = {}
IDS = itertools.count()
STEPS = itertools.count(1)
LOCK = threading.Lock()


def should_die(idx: int, t: int) -> bool:
    try:
        with open(ARGS.trigger) as f:
            hit = f.read().strip() == f"{idx}:{t}"
    except (OSError, TypeError):
        return False
    if hit:
        os.unlink(ARGS.trigger)
    return hit


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as AgentGym's uvicorn servers
    # headers and body go out as separate writes: without TCP_NODELAY, Nagle's algorithm and the client's
    # delayed ACK hold each answer ~40 ms (uvicorn sets TCP_NODELAY too)
    disable_nagle_algorithm = True

    def log_message(self, *args) -> None:
        pass

    def _send(self, body, status: int = 200) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        url = urlparse(self.path)
        q = {k: v[0] for k, v in parse_qs(url.query).items()}
        time.sleep(ARGS.delay)
        if url.path == "/":
            return self._send("ok")
        game = GAMES.get(int(q.get("env_idx", q.get("id", -1))))
        if url.path == "/observation" and game is not None:
            return self._send(f"Reach goal {game.idx}. [SEP] start")
        self._send({"detail": "Not Found"}, 404)

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
        time.sleep(ARGS.delay)
        env, path = ARGS.env, urlparse(self.path).path
        if path == "/create":
            with LOCK:
                i = next(IDS)
                GAMES[i] = Game()
            return self._send(i if env == "webshop" else {"id": i})
        game = GAMES.get(body.get("env_idx" if env == "webshop" else "id"))
        if game is None:
            return self._send({"error": "no such environment"})
        if path == "/reset":
            idx = int(body[{"webshop": "session_id", "alfworld": "game", "sciworld": "data_idx"}[env]])
            game.reset(idx)
            if env == "webshop":
                return self._send([f"Reach goal {idx}. [SEP] start", None])
            if env == "alfworld":
                return self._send({"id": body["id"], "observation": f"start. Your task is to: reach goal {idx}.",
                                   "available_actions": ["go", "wait"], "task_type": f"goal/trial_{idx}"})
            return self._send({"task_name": "goal", "var_num": idx, "task_description": f"Reach goal {idx}.",
                               "observation": "start", "reward": 0, "score": 0, "deleted": False, "done": False})
        if path == "/step":
            if ARGS.drop_every and next(STEPS) % ARGS.drop_every == 0:
                self.close_connection = True  # unanswered: the client sees the connection close
                return
            if should_die(game.idx, game.t + 1):
                os._exit(17)
            text, score, done = game.step(body["action"])
            if env == "webshop":
                return self._send({"state": text, "reward": score, "done": done, "info": None})
            if env == "alfworld":
                return self._send({"observation": text, "reward": float(done), "available_actions": ["go", "wait"],
                                   "done": done})
            return self._send({"observation": text, "reward": 0, "score": round(100 * score), "done": done})
        if path == "/close" and env == "sciworld":
            GAMES.pop(body.get("id"), None)
            return self._send({"closed": True})
        self._send({"detail": "Not Found"}, 404)


def main() -> None:
    global ARGS
    ap = argparse.ArgumentParser()
    ap.add_argument("port", type=int)
    ap.add_argument("env", choices=["webshop", "alfworld", "sciworld"])
    ap.add_argument("trigger", nargs="?")
    ap.add_argument("--delay", type=float, default=0.0)
    ap.add_argument("--drop-every", type=int, default=0)
    ARGS = ap.parse_args()
    server = ThreadingHTTPServer(("127.0.0.1", ARGS.port), Handler)
    server.daemon_threads = True
    server.request_queue_size = 128
    server.serve_forever()


if __name__ == "__main__":
    main()
