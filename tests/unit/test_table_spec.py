import dataclasses

import pytest
from ember.ps_server.errors import InvalidArgumentError
from ember.ps_server.wire.messages import pb
from ember.ps_server.wire.table_spec import (
    InitializerSpec,
    InitKind,
    OptimizerKind,
    OptimizerSpec,
    TableSpec,
)

GOOD = TableSpec(
    "user.v1",
    dim=32,
    initializer=InitializerSpec(InitKind.NORMAL, scale=0.1, seed=2**64 - 1),
    optimizer=OptimizerSpec(
        OptimizerKind.ADAM, lr=1e-3, eps=1e-8, beta1=0.9, beta2=0.99, weight_decay=0.1
    ),
)


def test_proto_round_trip_is_exact():
    assert TableSpec.from_proto(GOOD.to_proto()) == GOOD


@pytest.mark.parametrize(
    "change, message",
    [
        ({"dim": 0}, "dim must be in 1..4096"),
        ({"dim": 5000}, "dim must be in 1..4096"),
        ({"name": ""}, "table name"),
        ({"name": "has space"}, "table name"),
        ({"optimizer": OptimizerSpec(OptimizerKind.SGD, lr=-0.1)}, "lr must be > 0.0"),
        ({"optimizer": OptimizerSpec(OptimizerKind.SGD, lr=float("nan"))}, "lr must be"),
        ({"optimizer": OptimizerSpec(OptimizerKind.ADAGRAD, eps=0.0)}, "eps must be > 0.0"),
        (
            {"optimizer": OptimizerSpec(OptimizerKind.ADAM, beta1=1.0)},
            "beta1 must be >= 0.0 and < 1.0",
        ),
        ({"optimizer": OptimizerSpec(OptimizerKind.SGD, weight_decay=-1.0)}, "weight_decay"),
        ({"initializer": InitializerSpec(scale=float("inf"))}, "scale"),
    ],
)
def test_invalid_specs_are_rejected_with_the_field_named(change, message):
    with pytest.raises(InvalidArgumentError, match=message):
        dataclasses.replace(GOOD, **change).validate()


def test_unknown_optimizer_number_from_the_wire():
    message = GOOD.to_proto()
    message.optimizer.kind = 42
    with pytest.raises(
        InvalidArgumentError, match="unknown optimizer kind 42; use one of sgd, adagrad"
    ):
        TableSpec.from_proto(message)


def test_unspecified_optimizer_is_rejected_and_unspecified_initializer_is_uniform():
    message = pb.TableSpec(name="t", dim=4, optimizer=pb.Optimizer(kind=0, lr=0.1))
    with pytest.raises(InvalidArgumentError, match="unknown optimizer kind 0"):
        TableSpec.from_proto(message)
    message.optimizer.kind = pb.Optimizer.SGD
    assert TableSpec.from_proto(message).initializer.kind is InitKind.UNIFORM
