"""A text game served with OpenEnv's server SDK (``openenv.core.env_server.create_app``), for
tests/test_openenv.py: the goal game of tests/goal_env.py (three 'go' in a row win; on odd goals
'go', 'wait', 'go', so that a tiny policy loses some and ETO has pairs) behind OpenEnv's
reset/step/state over WebSocket.

``python tests/openenv_server.py <port> [<trigger file>]``: serves on 127.0.0.1:<port>; while the
trigger file holds ``seed:step``, the server process exits (a crash, no answer) when that step of
that task's episode arrives, and removes the file: a simulator server killed mid-episode.
"""

from __future__ import annotations

import os
import sys

from openenv.core.env_server import create_fastapi_app
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, Observation, State
from pydantic import Field

def gold(seed: int) -> list[str]:
    return ["go", "wait", "go"] if seed % 2 else ["go", "go", "go"]
TRIGGER: str | None = None


def should_die(seed: int, t: int) -> bool:
    try:
        with open(TRIGGER) as f:
            hit = f.read().strip() == f"{seed}:{t}"
    except (OSError, TypeError):
        return False
    if hit:
        os.unlink(TRIGGER)
    return hit


class TextAction(Action):
    message: str = Field(..., description="the agent's action, as text")


class TextObservation(Observation):
    text: str = ""
    instruction: str = ""
    valid_actions: list[str] = Field(default_factory=list)
    expert_actions: list[str] = Field(default_factory=list)
    success: bool = False


class GoalEnvironment(Environment):
    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self) -> None:
        super().__init__()
        self.seed, self.t, self.progress = 0, 0, 0

    def reset(self, seed=None, episode_id=None, **kwargs) -> TextObservation:
        self.seed, self.t, self.progress = int(seed or 0), 0, 0
        return TextObservation(text="start", instruction=f"Reach goal {self.seed}.", valid_actions=["go", "wait"],
                               expert_actions=gold(self.seed), reward=0.0)

    def step(self, action: TextAction, timeout_s=None, **kwargs) -> TextObservation:
        self.t += 1
        if should_die(self.seed, self.t):
            os._exit(17)  # the simulator's server dies: no answer
        path = gold(self.seed)
        right = self.progress == self.t - 1 and self.progress < len(path) and action.message == path[self.progress]
        self.progress += right
        won = self.progress == len(path)
        return TextObservation(text=f"step {self.t}", valid_actions=["go", "wait"], success=won, done=won,
                               reward=1.0 / len(path) if right else 0.0)

    @property
    def state(self) -> State:
        return State(episode_id=None, step_count=self.t)


app = create_fastapi_app(GoalEnvironment, TextAction, TextObservation, max_concurrent_envs=256)

if __name__ == "__main__":
    import uvicorn

    if len(sys.argv) > 2:
        TRIGGER = sys.argv[2]
    uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning")
