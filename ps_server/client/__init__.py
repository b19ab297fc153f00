"""The client side: PSClient, the step data plane and their calls to the shards.

Importing it loads no shard, store or durability module.
"""

from ember.ps_server.client.config import ClientConfig
from ember.ps_server.client.ps_client import PSClient
from ember.ps_server.client.step_client import StepClient
from ember.ps_server.client.step_job import StepJob
from ember.ps_server.wire.stats import ShardStats
from ember.ps_server.wire.table_spec import (
    InitializerSpec,
    InitKind,
    OptimizerKind,
    OptimizerSpec,
    TableSpec,
)

__all__ = [
    "ClientConfig",
    "InitKind",
    "InitializerSpec",
    "OptimizerKind",
    "OptimizerSpec",
    "PSClient",
    "ShardStats",
    "StepClient",
    "StepJob",
    "TableSpec",
]
