"""Agents: named profiles and the executors that turn a run into a process."""
