"""What the benchmarks' stand-in servers share with ``ember ps``: the flags LocalCluster passes,
and the ready file it waits for."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path


def shard_flags(description: str) -> argparse.ArgumentParser:
    """A parser of the flags LocalCluster gives a shard (those a stand-in ignores included)."""
    parser = argparse.ArgumentParser(description=description)
    for flag in ("--shard", "--num-shards", "--port", "--workers", "--max-message-bytes"):
        parser.add_argument(flag, type=int, default=0)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--ready-file", type=Path, required=True)
    return parser


def write_ready_file(path: Path, host: str, port: int) -> None:
    """Tell LocalCluster where the server listens (written whole, then renamed)."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps({"endpoint": f"{host}:{port}"}))
    os.replace(tmp, path)
