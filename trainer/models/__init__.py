"""Models whose embeddings come from the parameter servers."""
