"""What a run's process sees of the runner's environment: an allow-list, never all of it.

A runner's environment holds its own secrets (its coordinator token, cloud credentials,
the API keys of agents); a run executes whatever a client asked for, so it gets only:

    ALWAYS              PATH, HOME, LANG, LANGUAGE, LC_*, TERM, USER, LOGNAME, SHELL,
                        TMPDIR, TZ
    --pass-env PATTERN  names the runner's operator lets through (``fnmatch`` patterns)
    the executor's      what an agent CLI needs of the runner to work at all (``claude``:
                        its API key and provider settings, ``ClaudeExecutor.host_env``);
                        never given to a command run
    then the agent profile's ``env`` and the run's ``env`` (set by the executor).

Every run's process also learns which run and attempt it is (``attempt_identity``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from fnmatch import fnmatchcase

ALWAYS: tuple[str, ...] = (
    "PATH",
    "HOME",
    "LANG",
    "LANGUAGE",
    "LC_*",
    "TERM",
    "USER",
    "LOGNAME",
    "SHELL",
    "TMPDIR",
    "TZ",
)


def allowed(source: Mapping[str, str], patterns: Iterable[str]) -> dict[str, str]:
    """The variables of ``source`` whose names match one of ``patterns`` (case-sensitive)."""
    patterns = tuple(patterns)
    return {
        name: value
        for name, value in source.items()
        if any(fnmatchcase(name, pattern) for pattern in patterns)
    }


def run_environment(
    host: Mapping[str, str], pass_env: Iterable[str], executor_needs: Iterable[str]
) -> dict[str, str]:
    """The base environment of one run's process, before the profile's and run's ``env``."""
    return allowed(host, (*ALWAYS, *pass_env, *executor_needs))


def attempt_identity(run_id: str, attempt: int) -> dict[str, str]:
    """``CORRAL_RUN_ID`` and ``CORRAL_RUN_ATTEMPT`` (1, 2 …): a run started again after its
    runner was lost sees a new attempt, so work it records or calls (a ledger, an
    idempotency key) can tell a second execution from the first."""
    return {"CORRAL_RUN_ID": run_id, "CORRAL_RUN_ATTEMPT": str(attempt)}
