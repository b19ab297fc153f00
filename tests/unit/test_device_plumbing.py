"""The trainer's tensors follow its device. Without a GPU here, torch's "meta" device stands
in, under a mode that fails any op mixing devices, as CUDA kernels do: a forward pass that
runs under it and ends on meta shows every tensor was moved."""

import pytest
import torch
from ember.trainer.data.batch import Batch, JaggedIds
from ember.trainer.embedding import PSEmbeddingBagCollection
from ember.trainer.models.dlrm import DLRM
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten


class HostRows:
    """A row source that, as the real ones, speaks host tensors only."""

    def __init__(self, dim: int) -> None:
        self.dim, self.updates = dim, {}

    def rows(self, requests):
        for ids in requests.values():
            assert ids.device.type == "cpu"
        return {t: ids.float().unsqueeze(1).repeat(1, self.dim) for t, ids in requests.items()}

    def apply_gradients(self, updates):
        for ids, grads in updates.values():
            assert ids.device.type == "cpu" and grads.device.type == "cpu"
        self.updates = updates


class OneDevicePerOp(TorchFunctionMode):
    """Fails an op whose tensor arguments (other than scalars) sit on different devices;
    moving a tensor (``to``, ``cpu``) is the one op that may span two."""

    MOVES = frozenset({torch.Tensor.to, torch.Tensor.cpu})

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        leaves, _ = tree_flatten((args, kwargs))
        devices = {t.device.type for t in leaves if isinstance(t, torch.Tensor) and t.dim()}
        if len(devices) > 1 and func not in self.MOVES:
            raise AssertionError(f"{func} mixes devices {sorted(devices)}")
        return func(*args, **kwargs)


def test_the_guard_fails_a_mixed_device_op():
    with OneDevicePerOp(), pytest.raises(AssertionError, match="mixes devices"):
        torch.ones(2, device="meta") + torch.ones(2)


def _batch(samples: int = 4, features: int = 3) -> Batch:
    generator = torch.Generator().manual_seed(0)
    sparse = [
        JaggedIds(
            torch.randint(0, 50, (2 * samples,), generator=generator),
            torch.arange(0, 2 * samples + 1, 2),
        )
        for _ in range(features)
    ]
    return Batch(torch.rand(samples, 13, generator=generator), sparse, torch.ones(samples))


def test_pooling_the_dense_features_and_the_model_run_on_the_configured_device():
    batch = _batch().to(torch.device("meta"))
    assert batch.dense.device.type == batch.labels.device.type == "meta"
    assert all(f.values.device.type == "cpu" for f in batch.sparse)  # routed from the host
    ebc = PSEmbeddingBagCollection(HostRows(8), ["a", "b", "a"], device="meta")
    model = DLRM(13, 3, 8).to("meta")
    with OneDevicePerOp():
        pooled = ebc(batch.sparse)
        logits = model(batch.dense, pooled)
    assert pooled.device.type == "meta" and tuple(pooled.shape) == (4, 3, 8)
    assert logits.device.type == "meta" and tuple(logits.shape) == (4,)


def test_row_gradients_return_to_the_host_scaled():
    source = HostRows(4)
    ebc = PSEmbeddingBagCollection(source, ["a", "b", "a"], grad_scale=0.5, device="cpu")
    ebc(_batch().sparse).sum().backward()
    ebc.step()
    ids, grads = source.updates["a"]
    # Each distinct id's gradient is 0.5 x its count over both features of table "a".
    counts = torch.bincount(torch.cat([f.values for f in _batch().sparse[0::2]]), minlength=50)
    assert torch.equal(grads, 0.5 * counts[ids].float().unsqueeze(1).repeat(1, 4))
