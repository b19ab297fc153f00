"""A raw UCX bytes service: the transport floor of bench_ucx.py.

It accepts the ``ember ps`` flags (so LocalCluster starts it the same way as a
shard) and answers every call the way a shard's UCX listener does, two
messages each way, with no parsing: a 16-byte header (request bytes, reply
bytes, little-endian), then the request; the reply is as many bytes as asked.
The ready file names ``host:port`` of the UCX listener.
"""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

import numpy as np
from ember.ps_server.ucx import load_ucx, ucx_errors
from ember.ps_server.wire.messages import DEFAULT_MAX_MESSAGE_BYTES
from stand_in_flags import shard_flags, write_ready_file

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
    write_ready_file(ready_file, host, listener.port)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()
    listener.close()


def main() -> None:
    args = shard_flags(__doc__.splitlines()[0]).parse_args()
    max_bytes = args.max_message_bytes or DEFAULT_MAX_MESSAGE_BYTES
    asyncio.run(serve(args.host, args.port, args.ready_file, max_bytes))


if __name__ == "__main__":
    main()
