"""The local admin token in ``.corral/credentials``, so local use needs no set-up.

A coordinator started without ``CORRAL_TOKEN`` (``--token``) takes the token from
``.corral/credentials`` in its working directory, or makes one and writes it there (mode
0600) on its first start. The CLI and a runner started in that directory find it there;
anywhere else they need ``CORRAL_TOKEN``.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from corral.tokens import new_secret

CREDENTIALS = Path(".corral") / "credentials"


def read_token(directory: Path | None = None) -> str | None:
    """The token in ``<directory>/.corral/credentials`` (default: the current directory)."""
    path = (directory or Path.cwd()) / CREDENTIALS
    try:
        token = path.read_text().strip()
    except (FileNotFoundError, NotADirectoryError):
        return None
    return token or None


def auth_headers(token: str | None) -> dict[str, str]:
    """The header a CLI or runner sends (none without a token: the coordinator says 401)."""
    return {"Authorization": f"Bearer {token}"} if token else {}


def client_token(explicit: str | None, directory: Path | None = None) -> str | None:
    """What a CLI or runner sends: ``--token``/``CORRAL_TOKEN``, else the local file's."""
    return explicit or read_token(directory)


def coordinator_token(explicit: str | None, directory: Path | None = None) -> str:
    """The admin token a coordinator accepts: ``--token``/``CORRAL_TOKEN``, else the local
    file's, else a new one written there (readable by its owner only)."""
    if explicit:
        return explicit
    if found := read_token(directory):
        return found
    path = (directory or Path.cwd()) / CREDENTIALS
    path.parent.mkdir(parents=True, exist_ok=True)
    token = new_secret()
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:  # another process made it first: use theirs
        with contextlib.suppress(FileNotFoundError):
            if found := read_token(directory):
                return found
        raise
    with os.fdopen(fd, "w") as handle:
        handle.write(token + "\n")
    return token
