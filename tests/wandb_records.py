"""Read wandb's offline run files (``wandb/offline-run-*/run-*.wandb``) back, for the tests.

Written by hand because wandb 0.2x+ ships no Python reader of its transaction log any more (the
Go core writes it). The file is a LevelDB-style log: a 7-byte header (``:W&B``, magic, version),
then 32 KiB blocks of chunks (crc32 u32, length u16, type u8: 1 full, 2 first, 3 middle, 4 last),
each whole chunk sequence one ``wandb_internal_pb2.Record``.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

BLOCK = 32768


def records(path: Path) -> Iterator[Any]:
    from wandb.proto import wandb_internal_pb2 as pb

    data = path.read_bytes()
    assert data[:4] == b":W&B", f"{path}: not a wandb run file"
    pos, buf = 7, b""
    while pos + 7 <= len(data):
        left = BLOCK - pos % BLOCK
        if left < 7:  # a block's tail too short for a chunk header is padding
            pos += left
            continue
        _crc, n, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if n == 0 and kind == 0:
            pos += left
            continue
        buf += data[pos + 7:pos + 7 + n]
        pos += 7 + n
        if kind in (1, 4):
            r = pb.Record()
            r.ParseFromString(buf)
            buf = b""
            yield r


@dataclass
class OfflineRun:
    group: str = ""
    job_type: str = ""
    name: str = ""
    config: dict[str, Any] = field(default_factory=dict)
    summary: dict[str, Any] = field(default_factory=dict)
    history_rows: int = 0
    exit_code: int | None = None


def read_run(path: Path) -> OfflineRun:
    run = OfflineRun()
    for r in records(path):
        kind = r.WhichOneof("record_type")
        if kind == "run":
            run.group, run.job_type, run.name = r.run.run_group, r.run.job_type, r.run.display_name
            run.config.update({i.key: json.loads(i.value_json) for i in r.run.config.update})
        elif kind == "config":
            run.config.update({i.key: json.loads(i.value_json) for i in r.config.update})
        elif kind == "summary":
            run.summary.update({"/".join(i.nested_key) or i.key: json.loads(i.value_json) for i in r.summary.update})
        elif kind == "history":
            run.history_rows += 1
        elif kind == "exit":
            run.exit_code = r.exit.exit_code
    return run


def offline_runs(folder: Path) -> list[OfflineRun]:
    return [read_run(f) for f in sorted(Path(folder).glob("wandb/offline-run-*/run-*.wandb"))]
