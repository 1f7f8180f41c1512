"""corral: a durable control plane for coding agents and commands on a fleet of runners.

``corral.Client`` and ``corral.AsyncClient`` are its Python client (``corral.client``).
"""

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

if TYPE_CHECKING:
    from corral.client import AsyncClient, Client

__all__ = ["AsyncClient", "Client", "__version__"]


def __getattr__(name: str) -> Any:
    # Imported on first use: the runner and coordinator import ``corral`` too, and need
    # neither the client nor its models.
    if name in ("Client", "AsyncClient"):
        import corral.client

        return getattr(corral.client, name)
    raise AttributeError(f"module 'corral' has no attribute {name!r}")
