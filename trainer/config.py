"""TrainConfig: what one training run does, and the device it runs on."""

from __future__ import annotations

import dataclasses
import math
import os
from typing import ClassVar

import torch
from ember.ps_server.client.config import ClientConfig
from ember.ps_server.client.step_job import MODES
from ember.ps_server.wire.row_dtype import RowDtype
from ember.ps_server.wire.table_spec import OptimizerKind
from ember.trainer.balance import BALANCERS
from ember.trainer.cache.hot_cache import POLICIES
from ember.trainer.pipeline import ASYNC_NEEDS_STALENESS, MAX_STALENESS

from ember.settings import setting

DATA_PATHS = ("auto", "pipeline", "serial")
MAX_HISTORY = 4096  # sasrec: positions learned, and the attention's length squared
MAX_NEGATIVES = 100_000
SASREC_HEADS = 2


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """What one training run does (every rank gets the same config). Each field but
    ``endpoints`` and ``client`` is a setting (flag, EMBER_* variable and cluster-file key;
    see :mod:`ember.settings`), described by its help text."""

    ENV_PREFIX: ClassVar[str] = "EMBER_TRAIN_"

    endpoints: tuple[str, ...]
    client: ClientConfig = dataclasses.field(default_factory=ClientConfig)
    steps: int = setting(200, "training steps per rank")
    batch_size: int = setting(1024, "samples per step and rank")
    eval_batches: int = setting(8, "held-out batches evaluated on rank 0")
    dim: int = setting(16, "embedding width")
    optimizer: str = setting(
        "adagrad",
        "sparse optimizer",
        choices=[kind.lower() for kind in OptimizerKind.__members__],
    )
    sparse_lr: float = setting(0.05, "learning rate of the embeddings")
    dense_lr: float = setting(0.05, "learning rate of the dense layers")
    max_cardinality: int = setting(200_000, "cap on ids per feature")
    zipf_exponent: float = setting(1.2, "skew of the synthetic ids")
    seed: int = setting(0, "seed of the data and the initial parameters")
    criteo_path: str | None = setting(
        None,
        "train on this Criteo TSV file instead of synthetic data; every --heldout-every-th "
        "line is held out for evaluation",
        flag="--criteo",
    )
    table_prefix: str = setting("criteo", "PS tables are named PREFIX.f0 .. PREFIX.f25")
    progress: bool = setting(True, "a live progress line on rank 0")
    run_dir: str = setting(
        "",
        "write the run directory here (rank 0): config.json, metrics.jsonl (a line per step) "
        "and report.json; `ember report DIR` plots it",
    )
    metrics_port: int | None = setting(
        None,
        "serve Prometheus metrics on this port plus LOCAL_RANK (0: a free port per rank); "
        "none by default",
    )
    metrics_host: str = setting("127.0.0.1", "address the metrics endpoint binds")
    device: str = setting(
        "auto",
        "cpu, cuda or cuda:N; auto is cuda where torch sees a GPU, else cpu. Under torchrun, "
        "cuda is cuda:LOCAL_RANK. The process group follows: NCCL on GPUs, gloo on CPUs",
    )
    heldout_every: int = setting(
        10, "with --criteo, line n is held out when n % N == N-1 (default: every tenth)"
    )
    cache: str = setting(
        "none",
        "hot embeddings: none, static, lru, lfu (caches) or replicated",
        choices=("none", "replicated", *POLICIES),
    )
    cache_mb: float = setting(16.0, "cache memory budget per rank, MiB")
    pull_bound: int = setting(0, "versions a cached row may lag")
    push_bound: int = setting(0, "local updates a row may hold back")
    profile_batches: int = setting(32, "batches the cache profiler samples")
    data_path: str = setting(
        "auto",
        "pipeline (auto): each step's rows are fetched while the previous step computes and "
        "updates leave in the background, under step clocks for --cache none or replicated; "
        "the lru, lfu and static caches pull misses early and send their freshness checks "
        "behind the previous push. serial: pull, compute, push",
        choices=DATA_PATHS,
    )
    staleness: int = setting(
        0, "pipeline: step t reads every rank's updates of steps <= t-1-S; 0 is exact"
    )
    update_mode: str = setting(
        "exact",
        "pipeline: exact (the shards sum every rank's gradients of a step into one optimizer "
        "step per row, as one process would) or async (one step per rank's update)",
        choices=MODES,
    )
    wait_s: float = setting(
        120.0,
        "pipeline: how long a shard holds a step for other ranks before it fails, naming the "
        "ranks it waited for",
    )
    torch_threads: int = setting(
        0,
        "intra-op threads of this rank's tensor ops (0: torch's default). Use 1 when shards "
        "share the rank's cores: idle OpenMP threads spin and take their CPU",
    )
    flush_every: int = setting(
        1000,
        "--cache replicated: write the hot rows stepped since the last write-back to the "
        "shards every N steps (what a crashed trainer can lose); 0: at the end only",
    )
    wire_dtype: str = setting(
        "float32",
        "pipeline: how cold rows and their gradients travel; float16 and bfloat16 halve their "
        "bytes (the shards keep float32 rows and optimizer state). bfloat16 keeps float32's "
        "range; float16 refuses values beyond 65504",
        choices=[dtype.name.lower() for dtype in RowDtype],
    )
    model: str = setting(
        "dlrm",
        "dlrm (CTR on Criteo-style data) or sasrec (next-item prediction over user histories: "
        "synthetic heavy-tailed sequences, or --interactions)",
        choices=("dlrm", "sasrec"),
    )
    interactions_path: str | None = setting(
        None,
        "sasrec: train on this file of `user,item,timestamp` lines (tab or comma); every "
        "--heldout-every-th user is held out",
        flag="--interactions",
    )
    max_len: int = setting(
        50, "sasrec: longest history; longer ones keep their most recent items (counted)"
    )
    negatives: int = setting(32, "sasrec: sampled negative items per sample")
    balancer: str = setting(
        "cost",
        "sasrec: how a global batch's samples go to ranks: none (equal contiguous chunks), "
        "count (zig-zag by length, equal counts) or cost (near-equal sums of each sample's "
        "cost, fixed + scale * padded width^alpha)",
        choices=BALANCERS,
    )
    balance_alpha: float | None = setting(
        None,
        "balancer cost: a sample of length L costs --balance-fixed + L^alpha; default: "
        "fixed part and alpha calibrated on rank 0 at the start from timed passes of the "
        "model at every padded width",
    )
    balance_fixed: float = setting(
        0.0,
        "with --balance-alpha: the part of a sample's cost that does not grow with its "
        "length, in units of a length-1 sample's length part (calibrated otherwise)",
    )
    plan: str = setting(
        "",
        "auto: replicate the hot set and run at the staleness that `ember plan` chooses "
        "(the fastest predicted, near-ties to the least link time), within --cache-mb and up to "
        "--staleness (so give --staleness 1 or more to let it choose), with --plan-figures' machine figures; FILE: apply a plan `ember plan "
        "--out FILE` wrote for this workload. Sets cache (replicated, or none), cache_mb and "
        "staleness",
    )
    plan_figures: str = setting(
        "", "--plan auto: the machine figures file (`ember plan --calibrate --out FILE`)"
    )

    @property
    def transport(self) -> str:
        """What carries the step calls (the client config's choice)."""
        return self.client.transport

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
        self.client.validate()
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
        if self.metrics_port is not None and not 0 <= self.metrics_port <= 65535 - 64:
            raise ValueError(f"metrics_port must be in 0..65471, got {self.metrics_port}")
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
        if self.plan and (self.cache not in ("none", "replicated") or not self.pipelined()):
            raise ValueError(
                "--plan chooses a replicated hot set on the step pipeline: use it with cache "
                f"none or replicated and data_path auto or pipeline, not cache {self.cache!r} "
                f"on data_path {self.data_path!r}"
            )
        if self.model not in ("dlrm", "sasrec"):
            raise ValueError(f"model must be dlrm or sasrec, got {self.model!r}")
        if self.balancer not in BALANCERS:
            raise ValueError(f"balancer must be one of {', '.join(BALANCERS)}")
        if self.balance_alpha is not None and not (
            math.isfinite(self.balance_alpha) and self.balance_alpha > 0
        ):
            raise ValueError(f"balance_alpha must be > 0, got {self.balance_alpha}")
        if not (1 <= self.max_len <= MAX_HISTORY and 1 <= self.negatives <= MAX_NEGATIVES):
            raise ValueError(
                f"max_len must be in 1..{MAX_HISTORY} and negatives in 1..{MAX_NEGATIVES}, got "
                f"{self.max_len}, {self.negatives}"
            )
        if self.model == "sasrec":
            self._validate_sequence_model()
        elif self.interactions_path or self.balance_alpha is not None or self.balance_fixed:
            raise ValueError(
                "--interactions, --balance-alpha and --balance-fixed are for model sasrec"
            )
        if not (math.isfinite(self.balance_fixed) and self.balance_fixed >= 0):
            raise ValueError(f"balance_fixed must be >= 0, got {self.balance_fixed}")
        if self.balance_fixed and self.balance_alpha is None:
            raise ValueError(
                "--balance-fixed goes with --balance-alpha (both given, or both calibrated)"
            )
        if self.plan_figures and self.plan != "auto":
            raise ValueError("plan_figures is read by --plan auto only")
        resolve_device(self.device)

    def _validate_sequence_model(self) -> None:
        if self.plan or self.criteo_path or self.cache != "none":
            raise ValueError(
                "model sasrec trains with cache none (its rows go through the step pipeline); "
                "--plan and --criteo are for model dlrm"
            )
        if self.dim % SASREC_HEADS:
            raise ValueError(f"model sasrec needs dim divisible by {SASREC_HEADS}, got {self.dim}")
        if self.run_dir or self.metrics_port is not None:
            raise ValueError(
                "model sasrec writes its report with --report; --run-dir and --metrics-port "
                "are not wired to it yet"
            )


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
