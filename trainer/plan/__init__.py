"""The communication planner: what to replicate and how stale to run, from a model of the lookup traffic."""
