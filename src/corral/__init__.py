"""corral: a durable control plane for coding agents and commands on a fleet of runners."""

__version__ = "0.1.0"
