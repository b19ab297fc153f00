"""Training data: the batch layout, synthetic Criteo-style data and the Criteo TSV reader."""
