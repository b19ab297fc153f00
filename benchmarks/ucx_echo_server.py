"""A raw UCX bytes service: the transport floor of bench_ucx.py.

It accepts the ``ember ps`` flags (so LocalCluster starts it the same way as a
shard) and answers every call the way a shard's UCX listener does, two
messages each way, with no parsing: a 16-byte header (request bytes, reply
bytes, little-endian), then the request; the reply is as many bytes as asked.
The ready file names ``host:port`` of the UCX listener.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
from pathlib import Path

import numpy as np
from ember.ps_server.ucx import load_ucx, ucx_errors

SIZES = np.dtype("<u8")


async def serve(host: str, port: int, ready_file: Path, max_bytes: int) -> None:
    ucx = load_ucx()
    errors = ucx_errors(ucx)
    reply = np.zeros(max_bytes, dtype=np.uint8)

    async def handle(endpoint) -> None:
        sizes = np.empty(2, dtype=SIZES)
        try:
            while True:
                await endpoint.recv(sizes)
                request = np.empty(int(sizes[0]), dtype=np.uint8)
                await endpoint.recv(request)
                await endpoint.send(sizes)
                await endpoint.send(reply[: int(sizes[1])])
        except errors:
            pass

    listener = ucx.create_listener(handle, port=port)
    tmp = ready_file.with_name(ready_file.name + ".tmp")
    tmp.write_text(json.dumps({"endpoint": f"{host}:{listener.port}"}))
    os.replace(tmp, ready_file)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()
    listener.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for flag in ("--shard", "--num-shards", "--port", "--workers", "--max-message-bytes"):
        parser.add_argument(flag, type=int, default=0)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--ready-file", type=Path, required=True)
    args = parser.parse_args()
    asyncio.run(serve(args.host, args.port, args.ready_file, args.max_message_bytes or 64 << 20))


if __name__ == "__main__":
    main()
