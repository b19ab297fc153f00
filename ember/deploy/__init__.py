"""Deployment: one cluster file, and the launchers that run it (local processes, compose)."""
