"""Embeddings: the backbone interface and registry, the built-in backbones, batching and the cache."""
