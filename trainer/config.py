"""TrainConfig: what one training run does, and the device it runs on."""

from __future__ import annotations

import dataclasses
import os

import torch
from ember.ps_server.client.step_client import MODES
from ember.ps_server.client.transport import check_transport
from ember.ps_server.wire.row_dtype import RowDtype
from ember.ps_server.wire.table_spec import OptimizerKind
from ember.trainer.cache.hot_cache import POLICIES
from ember.trainer.pipeline import ASYNC_NEEDS_STALENESS, MAX_STALENESS

DATA_PATHS = ("auto", "pipeline", "serial")


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """What one training run does (every rank gets the same config)."""

    endpoints: tuple[str, ...]
    steps: int = 200
    batch_size: int = 1024
    eval_batches: int = 8
    dim: int = 16
    optimizer: str = "adagrad"
    sparse_lr: float = 0.05
    dense_lr: float = 0.05
    max_cardinality: int = 200_000
    zipf_exponent: float = 1.2
    seed: int = 0
    criteo_path: str | None = None
    table_prefix: str = "criteo"
    progress: bool = True
    device: str = "auto"
    heldout_every: int = 10
    cache: str = "none"
    cache_mb: float = 16.0
    pull_bound: int = 0
    push_bound: int = 0
    profile_batches: int = 32
    data_path: str = "auto"
    staleness: int = 0
    update_mode: str = "exact"
    wait_s: float = 120.0
    torch_threads: int = 0
    flush_every: int = 1000
    transport: str = "grpc"
    wire_dtype: str = "float32"

    def pipelined(self) -> bool:
        """Whether the next step's rows are fetched while a step computes (``auto``: yes).

        No cache and replicas go through the clocked step pipeline; the lru, lfu and static
        caches pull the next step's misses early and send its freshness checks behind this
        step's push.
        """
        return self.data_path in ("auto", "pipeline")

    def clocked(self) -> bool:
        """Whether rows travel over the clocked step data plane (staleness, update mode)."""
        return self.pipelined() and self.cache in ("none", "replicated")

    def validate(self) -> None:
        """Raise ValueError naming the first bad field."""
        if not self.endpoints:
            raise ValueError("endpoints must list at least one shard")
        for name in ("steps", "batch_size", "eval_batches", "dim", "max_cardinality"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.optimizer.upper() not in OptimizerKind.__members__:
            raise ValueError(
                f"optimizer must be one of {', '.join(k.lower() for k in OptimizerKind.__members__)}"
            )
        if not (self.sparse_lr > 0 and self.dense_lr > 0):
            raise ValueError("learning rates must be > 0")
        if self.cache not in ("none", "replicated", *POLICIES):
            raise ValueError(
                f"cache must be one of none, replicated, {', '.join(POLICIES)}, got {self.cache!r}"
            )
        if self.cache != "none" and not self.cache_mb > 0:
            raise ValueError(f"cache_mb must be > 0, got {self.cache_mb}")
        if self.pull_bound < 0 or self.push_bound < 0 or self.profile_batches < 1:
            raise ValueError("pull_bound and push_bound must be >= 0 and profile_batches >= 1")
        if self.heldout_every < 2:
            raise ValueError(f"heldout_every must be >= 2, got {self.heldout_every}")
        if self.data_path not in DATA_PATHS:
            raise ValueError(
                f"data_path must be one of {', '.join(DATA_PATHS)}, got {self.data_path!r}"
            )
        check_transport(self.transport)
        if self.transport == "ucx" and not (
            self.pipelined() and self.cache in ("none", "replicated")
        ):
            raise ValueError(
                "transport ucx carries the step calls only: use cache none or replicated on "
                f"data_path auto or pipeline (cache {self.cache!r} on data_path "
                f"{self.data_path!r} pulls and pushes over gRPC)"
            )
        if RowDtype.parse(self.wire_dtype) is not RowDtype.FLOAT32 and not self.clocked():
            raise ValueError(
                f"wire_dtype {self.wire_dtype} packs the rows of the clocked step pipeline (cache "
                f"none or replicated, data_path auto or pipeline); cache {self.cache!r} on "
                f"data_path {self.data_path!r} pulls and pushes float32"
            )
        if not 0 <= self.staleness <= MAX_STALENESS:
            raise ValueError(f"staleness must be in 0..{MAX_STALENESS}, got {self.staleness}")
        if self.update_mode not in MODES:
            raise ValueError(
                f"update_mode must be one of {', '.join(MODES)}, got {self.update_mode!r}"
            )
        if self.flush_every < 0:
            raise ValueError(
                f"flush_every must be >= 0 (0: at the end only), got {self.flush_every}"
            )
        if self.torch_threads < 0:
            raise ValueError(
                f"torch_threads must be >= 0 (0: torch's default), got {self.torch_threads}"
            )
        if not 0.001 <= self.wait_s <= 3600:
            raise ValueError(f"wait_s must be in [0.001, 3600], got {self.wait_s}")
        if self.cache == "replicated" and not self.pipelined():
            raise ValueError(
                "cache replicated needs data_path auto or pipeline: its cold rows go through "
                "the step pipeline, whose updates let a checkpoint ask for the replicas first"
            )
        if self.clocked() and self.update_mode == "async" and self.staleness == 0:
            raise ValueError(ASYNC_NEEDS_STALENESS)
        if not self.clocked() and (self.staleness or self.update_mode != "exact"):
            raise ValueError(
                "staleness and update_mode belong to the clocked step pipeline (cache none or "
                f"replicated, data_path auto or pipeline); cache {self.cache!r} on data_path "
                f"{self.data_path!r} bounds staleness with pull_bound and push_bound"
            )
        resolve_device(self.device)


def resolve_device(requested: str) -> torch.device:
    """The device a rank trains on.

    ``auto`` is ``cuda`` where torch sees a GPU, else ``cpu``; ``cuda`` without
    an index is ``cuda:LOCAL_RANK`` (one GPU per torchrun rank).

    Raises:
        ValueError: not cpu, cuda or cuda:N, or a GPU that torch does not see.
    """
    if requested == "auto":
        requested = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        device = torch.device(requested)
    except RuntimeError:
        device = None
    if device is None or device.type not in ("cpu", "cuda"):
        raise ValueError(f"device must be auto, cpu, cuda or cuda:N, got {requested!r}")
    if device.type == "cpu":
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise ValueError(
            f"device {requested!r}, but torch sees no GPU (torch {torch.__version__}, built with "
            f"CUDA {torch.version.cuda or 'none'}); use --device cpu"
        )
    index = device.index if device.index is not None else int(os.environ.get("LOCAL_RANK", "0"))
    if index >= torch.cuda.device_count():
        raise ValueError(f"device cuda:{index}, but torch sees {torch.cuda.device_count()} GPU(s)")
    return torch.device("cuda", index)


def process_group_backend(device: torch.device) -> str:
    """The torch.distributed backend for ranks on ``device``: NCCL for GPUs, gloo for CPUs."""
    return "nccl" if device.type == "cuda" else "gloo"
