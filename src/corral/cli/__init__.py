"""The ``corral`` command line: a thin adapter over the coordinator, runner and client."""
