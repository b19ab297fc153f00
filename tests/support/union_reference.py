"""The single-process reference of N ranks in exact mode: one process on the union of their
batches."""

from __future__ import annotations

import torch
from ember.kernels.optim import apply_rows
from ember.trainer.models.dlrm import DLRM


def union_reference(config, data, specs, start, ranks: int = 2):
    """One process training on the union of every rank's batches, each row stepped once per
    step with its summed gradient by the shard's own optimizer rule, from ``start`` rows
    (weights, state, versions per table). Returns the losses and the rows after each number
    of steps (``[0]`` is ``start``, ``[-1]`` the final rows)."""
    weights = [rows.clone().requires_grad_() for rows, _, _ in start]
    state = [moments.clone() for _, moments, _ in start]
    versions = [v.clone() for _, _, v in start]
    torch.manual_seed(config.seed)
    model = DLRM(13, data.num_features, config.dim)
    dense_opt = torch.optim.Adagrad(model.parameters(), lr=config.dense_lr)
    losses, after = [], [start]
    for step in range(config.steps):
        parts = [data.batch(config.batch_size, step, "train", part=rank) for rank in range(ranks)]
        embedded = torch.cat(
            [
                torch.stack(
                    [
                        torch.nn.functional.embedding_bag(
                            f.values, w, f.offsets, mode="sum", include_last_offset=True
                        )
                        for f, w in zip(p.sparse, weights)
                    ],
                    dim=1,
                )
                for p in parts
            ]
        )
        labels = torch.cat([p.labels for p in parts])
        dense = torch.cat([p.dense for p in parts])
        dense_opt.zero_grad()
        for w in weights:
            w.grad = None
        loss = torch.nn.functional.binary_cross_entropy_with_logits(model(dense, embedded), labels)
        loss.backward()
        dense_opt.step()
        losses.append(loss.item())
        for feature, (spec, w) in enumerate(zip(specs, weights)):
            touched = torch.unique(torch.cat([p.sparse[feature].values for p in parts]))
            rows, moments = w.detach()[touched], state[feature][touched]
            versions[feature][touched] += 1
            apply_rows(spec.optimizer, rows, moments, w.grad[touched], versions[feature][touched])
            with torch.no_grad():
                w[touched] = rows
            state[feature][touched] = moments
        after.append(
            [
                (w.detach().clone(), m.clone(), v.clone())
                for w, m, v in zip(weights, state, versions)
            ]
        )
    return losses, after


def pretrained_tables(client, specs, sizes, dim: int = 8) -> list:
    """Create the tables and give every row an earlier training (two steps of random
    gradients: version 2, optimizer state set); returns their rows (weights, state,
    versions per table), the start of :func:`union_reference`. From a zero state an Adagrad
    or Adam step of a row is about +-lr whatever the gradient's size, so a tiny gradient
    summed in another order than the reference's could flip it."""
    generator = torch.Generator().manual_seed(3)
    for spec, size in zip(specs, sizes):
        client.create_table(spec)
        for _ in range(2):
            client.push(spec.name, torch.arange(size), torch.randn(size, dim, generator=generator))
    return [
        client.pull_with_state(spec.name, torch.arange(size)) for spec, size in zip(specs, sizes)
    ]
