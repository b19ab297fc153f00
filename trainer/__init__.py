"""Trainer side: PS-backed embeddings, hot-embedding caches, DLRM, data and the training loop."""
