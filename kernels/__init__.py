"""Ember's native C++/CUDA ops and their one loader (see loader.py)."""
