"""A raw gRPC bytes service: the transport baseline of bench_ps.py.

It accepts the ``ember ps`` flags (so LocalCluster starts it the same way as a
shard) and serves two methods with identity (de)serialisers:

* ``/ember.bench.Echo/Pull``: request = packed ids; reply = as many bytes as a
  pull reply of that many rows of ``--dim`` floats plus int64 versions.
* ``/ember.bench.Echo/Rows``: request = packed ids (and whatever framing); reply = as many
  bytes as the weights of that many rows of ``--dim`` floats (a step lookup's reply).
* ``/ember.bench.Echo/Push``: request = any bytes; reply = 8 bytes.
"""

from __future__ import annotations

import os
import signal
import threading
from concurrent import futures

import grpc
from ember.ps_server.shard.malloc_tuning import retain_freed_buffers
from ember.ps_server.wire.messages import DEFAULT_MAX_MESSAGE_BYTES, message_size_options
from stand_in_flags import shard_flags, write_ready_file

SERVICE = "ember.bench.Echo"


def _handlers(dim: int, max_rows: int) -> grpc.GenericRpcHandler:
    row_bytes = 4 * dim + 8
    payload = os.urandom(max_rows * row_bytes)

    def pull(request: bytes, context: grpc.ServicerContext) -> bytes:
        return payload[: (len(request) // 8) * row_bytes]

    def rows(request: bytes, context: grpc.ServicerContext) -> bytes:
        return payload[: (len(request) // 8) * 4 * dim]

    def push(request: bytes, context: grpc.ServicerContext) -> bytes:
        return len(request).to_bytes(8, "little")

    methods = {
        "Pull": grpc.unary_unary_rpc_method_handler(pull),
        "Rows": grpc.unary_unary_rpc_method_handler(rows),
        "Push": grpc.unary_unary_rpc_method_handler(push),
    }
    return grpc.method_handlers_generic_handler(SERVICE, methods)


def main() -> None:
    parser = shard_flags(__doc__.splitlines()[0])
    parser.add_argument("--dim", type=int, default=64)
    args = parser.parse_args()
    max_bytes = args.max_message_bytes or DEFAULT_MAX_MESSAGE_BYTES
    retain_freed_buffers(max_bytes)  # as a shard does
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=args.workers or 8),
        options=message_size_options(max_bytes),
    )
    server.add_generic_rpc_handlers((_handlers(args.dim, max_bytes // (4 * args.dim + 8)),))
    port = server.add_insecure_port(f"{args.host}:{args.port}")
    server.start()
    write_ready_file(args.ready_file, args.host, port)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    while not stop.wait(0.5):
        pass
    server.stop(1).wait()


if __name__ == "__main__":
    main()
