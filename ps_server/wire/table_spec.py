"""Typed table specifications and their validation and wire conversion."""

from __future__ import annotations

import dataclasses
import enum
import re

from ember.ps_server.errors import InvalidArgumentError
from ember.ps_server.wire.messages import pb

MAX_DIM = 4096
_NAME_PATTERN = re.compile(r"^[A-Za-z0-9_.\-]{1,128}$")


class InitKind(enum.Enum):
    """Row initialisers; values are the wire enum numbers."""

    UNIFORM = 1
    NORMAL = 2
    ZEROS = 3


class OptimizerKind(enum.Enum):
    """Server-side optimizers; values are the wire enum numbers."""

    SGD = 1
    ADAGRAD = 2
    ROWWISE_ADAGRAD = 3
    ADAM = 4


@dataclasses.dataclass(frozen=True)
class InitializerSpec:
    """How a row is initialised on first touch: U(-scale, scale), N(0, scale^2) or zeros."""

    kind: InitKind = InitKind.UNIFORM
    scale: float = 0.01
    seed: int = 0


@dataclasses.dataclass(frozen=True)
class OptimizerSpec:
    """Server-side optimizer and its hyper-parameters (see the .proto for the update rules)."""

    kind: OptimizerKind = OptimizerKind.SGD
    lr: float = 0.01
    eps: float = 1e-8
    beta1: float = 0.9
    beta2: float = 0.999
    weight_decay: float = 0.0


@dataclasses.dataclass(frozen=True)
class TableSpec:
    """An embedding table: name, row width, initialiser and optimizer.

    Example:
        >>> spec = TableSpec("user", dim=64, optimizer=OptimizerSpec(OptimizerKind.ADAGRAD, lr=0.05))
        >>> spec.validate()
    """

    name: str
    dim: int
    initializer: InitializerSpec = InitializerSpec()
    optimizer: OptimizerSpec = OptimizerSpec()

    def validate(self) -> None:
        """Raise InvalidArgumentError naming the first field that is out of range."""
        if not _NAME_PATTERN.match(self.name):
            raise InvalidArgumentError(
                f"table name {self.name!r} must be 1..128 characters of [A-Za-z0-9_.-]"
            )
        if not 1 <= self.dim <= MAX_DIM:
            raise InvalidArgumentError(
                f"table {self.name!r}: dim must be in 1..{MAX_DIM}, got {self.dim}"
            )
        init = self.initializer
        if not isinstance(init.kind, InitKind):
            raise InvalidArgumentError(f"table {self.name!r}: unknown initializer {init.kind!r}")
        if not (init.scale >= 0.0 and init.scale < float("inf")):
            raise InvalidArgumentError(
                f"table {self.name!r}: initializer scale must be finite and >= 0"
            )
        if not 0 <= init.seed < 2**64:
            raise InvalidArgumentError(f"table {self.name!r}: seed must be in 0..2^64-1")
        opt = self.optimizer
        if not isinstance(opt.kind, OptimizerKind):
            raise InvalidArgumentError(
                f"table {self.name!r}: unknown optimizer {opt.kind!r}; "
                f"use one of {', '.join(k.name.lower() for k in OptimizerKind)}"
            )
        _check_range(self.name, "lr", opt.lr, low=0.0, low_open=True)
        _check_range(self.name, "eps", opt.eps, low=0.0, low_open=opt.kind is not OptimizerKind.SGD)
        _check_range(self.name, "weight_decay", opt.weight_decay, low=0.0)
        if opt.kind is OptimizerKind.ADAM:
            for field, value in (("beta1", opt.beta1), ("beta2", opt.beta2)):
                _check_range(self.name, field, value, low=0.0, high=1.0)

    def to_proto(self) -> pb.TableSpec:
        """The wire form of this spec."""
        init, opt = self.initializer, self.optimizer
        return pb.TableSpec(
            name=self.name,
            dim=self.dim,
            initializer=pb.Initializer(kind=init.kind.value, scale=init.scale, seed=init.seed),
            optimizer=pb.Optimizer(
                kind=opt.kind.value,
                lr=opt.lr,
                eps=opt.eps,
                beta1=opt.beta1,
                beta2=opt.beta2,
                weight_decay=opt.weight_decay,
            ),
        )

    @classmethod
    def from_proto(cls, message: pb.TableSpec) -> TableSpec:
        """Parse and validate a wire spec; raises InvalidArgumentError."""
        init, opt = message.initializer, message.optimizer
        init_kind = (
            InitKind.UNIFORM
            if init.kind == 0
            else _enum_or_error(InitKind, init.kind, "initializer")
        )
        spec = cls(
            name=message.name,
            dim=message.dim,
            initializer=InitializerSpec(kind=init_kind, scale=init.scale, seed=init.seed),
            optimizer=OptimizerSpec(
                kind=_enum_or_error(OptimizerKind, opt.kind, "optimizer"),
                lr=opt.lr,
                eps=opt.eps,
                beta1=opt.beta1,
                beta2=opt.beta2,
                weight_decay=opt.weight_decay,
            ),
        )
        spec.validate()
        return spec


def _enum_or_error(enum_cls: type[enum.Enum], number: int, what: str) -> enum.Enum:
    try:
        return enum_cls(number)
    except ValueError:
        names = ", ".join(k.name.lower() for k in enum_cls)
        raise InvalidArgumentError(f"unknown {what} kind {number}; use one of {names}") from None


def _check_range(
    table: str,
    field: str,
    value: float,
    *,
    low: float,
    high: float = float("inf"),
    low_open: bool = False,
) -> None:
    ok = (value > low if low_open else value >= low) and value < high
    if not ok:
        bound = f"{'>' if low_open else '>='} {low}" + (
            f" and < {high}" if high != float("inf") else ""
        )
        raise InvalidArgumentError(
            f"table {table!r}: optimizer {field} must be {bound}, got {value}"
        )
