"""Running ``git`` and setup commands: a scrubbed environment, captured output, checked status.

Every ``git`` call names the exit statuses it expects (``ok``, ``(0,)`` unless told); any
other status raises ``GitError`` carrying the command line, the directory it ran in and
git's stderr. Nothing here ever prompts: stdin is closed and ``GIT_TERMINAL_PROMPT=0``.
"""

from __future__ import annotations

import os
import shlex
import subprocess
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from corral.errors import CorralError

OUTPUT_CAP = 8192  # characters of a failed command's output kept in the error

# Variables that would point git somewhere other than the directory it is run in (set, for
# instance, when corral itself runs from a git hook).
_SCRUBBED = (
    "GIT_DIR",
    "GIT_WORK_TREE",
    "GIT_INDEX_FILE",
    "GIT_COMMON_DIR",
    "GIT_OBJECT_DIRECTORY",
    "GIT_ALTERNATE_OBJECT_DIRECTORIES",
    "GIT_NAMESPACE",
    "GIT_PREFIX",
)


class WorkspaceError(CorralError):
    code = "workspace_error"


class GitError(WorkspaceError):
    """A git command failed; ``details`` has ``command``, ``cwd``, ``returncode``, ``stderr``."""

    code = "git_failed"


class SetupFailed(WorkspaceError):
    """The worktree's setup command failed; ``details`` has ``command`` and ``output``."""

    code = "setup_failed"


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _SCRUBBED}
    env["GIT_TERMINAL_PROMPT"] = "0"
    env["GIT_MERGE_AUTOEDIT"] = "no"
    env.update(extra)
    return env


def tail(text: str, cap: int = OUTPUT_CAP) -> str:
    text = text.strip()
    return text if len(text) <= cap else "…" + text[-cap:]


def run_git(
    cwd: Path,
    *args: str,
    ok: Iterable[int] = (0,),
    stdin: str | None = None,
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run ``git -C cwd *args``; raise ``GitError`` unless its exit status is in ``ok``."""
    command = ["git", "-C", str(cwd), *args]
    try:
        proc = subprocess.run(
            command,
            input=stdin,
            stdin=subprocess.DEVNULL if stdin is None else None,
            capture_output=True,
            text=True,
            encoding="utf-8",
            errors="surrogateescape",
            env=env if env is not None else clean_env(),
        )
    except OSError as e:
        raise GitError(f"cannot run `{shlex.join(command)}`: {e}", command=command) from e
    if proc.returncode not in tuple(ok):
        stderr = tail(proc.stderr or proc.stdout)
        raise GitError(
            f"`{shlex.join(command)}` failed (exit {proc.returncode}): {stderr or 'no output'}",
            command=command,
            cwd=str(cwd),
            returncode=proc.returncode,
            stderr=stderr,
        )
    return proc


def run_setup(
    command: Sequence[str], cwd: Path, timeout: float | None, env: Mapping[str, str] | None = None
) -> None:
    """Run a worktree's setup command; raise ``SetupFailed`` with its output if it fails.
    ``env``: its whole environment (a runner gives what its runs may see, not its own)."""
    shown = shlex.join(command)
    try:
        proc = subprocess.run(
            list(command),
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
            env=clean_env() if env is None else {**env, "GIT_TERMINAL_PROMPT": "0"},
            timeout=timeout,
        )
    except subprocess.TimeoutExpired as e:
        out = e.output.decode(errors="replace") if isinstance(e.output, bytes) else e.output
        raise SetupFailed(
            f"setup command `{shown}` timed out after {timeout}s in {cwd}: {tail(out or '')}",
            command=list(command),
            output=tail(out or ""),
        ) from e
    except OSError as e:
        raise SetupFailed(f"cannot run setup command `{shown}`: {e}", command=list(command)) from e
    if proc.returncode != 0:
        output = tail(proc.stdout)
        raise SetupFailed(
            f"setup command `{shown}` failed (exit {proc.returncode}) in {cwd}: "
            f"{output or 'no output'}",
            command=list(command),
            returncode=proc.returncode,
            output=output,
        )
