"""Settings every test process and every process it starts shares."""

import os

# UCX between processes on one host over TCP on loopback only, as CI runs it (shards and
# trainers the tests start inherit it): no UCX traffic leaves the host's loopback.
os.environ.setdefault("UCX_TLS", "tcp")
os.environ.setdefault("UCX_NET_DEVICES", "lo")
