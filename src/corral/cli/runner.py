"""``corral runner``: the process that claims runs and actors from a coordinator.

Kept apart from ``servers.py`` so that starting a runner imports neither the coordinator
nor the web framework (``corral up`` uses the options below too).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import click

from corral.actors.kinds import load_kinds
from corral.cli.log_format import configure_logging, log_format_option
from corral.cli.options import URLS, comma_list, labels_from, option
from corral.credentials import client_token
from corral.runner.core import RunnerCore
from corral.runner.process import run_loop
from corral.runner.settings import RunnerSettings


def runner_options(fn: click.decorators.FC) -> click.decorators.FC:
    for decorate in reversed(
        [
            option(
                "--name",
                env="RUNNER_NAME",
                default=None,
                help="Runner name (default: host name); resumes go back to it.",
            ),
            option(
                "--slots",
                env="SLOTS",
                default=4,
                type=click.IntRange(1, 1024),
                help="Runs executed at once.",
            ),
            option("--labels", env="LABELS", default="", help="Comma-separated labels."),
            option(
                "--claude-bin",
                env="CLAUDE_BIN",
                default="claude",
                help="The Claude Code executable.",
            ),
            option(
                "--agent-token",
                env="AGENT_TOKEN",
                default=None,
                show_default=False,
                help="A client token (corral tokens create --role client) this runner's "
                "agents all get for corral's MCP server, to start sub-agents (--agent-mcp: "
                "each its own instead).",
            ),
            option(
                "--agent-mcp",
                env="AGENT_MCP",
                is_flag=True,
                default=False,
                help="Give each agent corral's MCP server with a token minted for its own "
                "run: it starts and cancels runs only as its own session's children. "
                "Without this or --agent-token agents get no corral MCP server.",
            ),
            option(
                "--drain-grace",
                env="DRAIN_GRACE",
                default=120.0,
                type=float,
                help="On SIGTERM, seconds running work may go on before it is stopped.",
            ),
            option(
                "--pass-env",
                env="PASS_ENV",
                default="",
                help="Comma-separated names (fnmatch patterns, e.g. 'MY_*') of this "
                "runner's environment its runs may see; beyond PATH, HOME, LANG, LC_*, "
                "TERM, USER, LOGNAME, SHELL, TMPDIR and TZ they see nothing of it.",
            ),
            option(
                "--transport",
                env="TRANSPORT",
                default="websocket",
                type=click.Choice(["websocket", "poll"]),
                help="Link to the coordinator: a WebSocket, or the HTTP long-poll.",
            ),
            option(
                "--pool",
                env="POOL",
                default="default",
                help="The pool whose actors this runner hosts.",
            ),
            option(
                "--actor-slots",
                env="ACTOR_SLOTS",
                default=16,
                type=click.IntRange(1, 1024),
                help="Actors hosted at once (the kinds are the config's [actors.<name>]).",
            ),
        ]
    ):
        fn = decorate(fn)
    return fn


def runner_settings(
    url: str,
    name: str | None,
    slots: int,
    labels: str,
    claude_bin: str,
    agent_token: str | None,
    agent_mcp: bool,
    drain_grace: float,
    pass_env: str,
    transport: str,
    pool: str,
    actor_slots: int,
    config: Path | None,
) -> RunnerSettings:
    settings = RunnerSettings(
        coordinator_url=url,
        slots=slots,
        claude_bin=claude_bin,
        agent_token=agent_token,
        agent_mcp=agent_mcp,
        drain_grace_s=drain_grace,
        transport=transport,
        labels=labels_from([labels]),
        pass_env=comma_list(pass_env),
        actor_kinds=load_kinds(config),
        pool=pool,
        actor_slots=actor_slots,
    )
    return settings if name is None else RunnerSettings(**{**settings.__dict__, "name": name})


@click.command("runner")
@option(
    "--url",
    "--coordinator",
    "url",
    env="URL",
    type=URLS,
    default="http://127.0.0.1:8765",
    help="The coordinator's URL (--coordinator: the same); several coordinators on one "
    "PostgreSQL database: their URLs separated by commas, or a name with an address for "
    "each, tried in turn.",
)
@option(
    "--token",
    env="TOKEN",
    default=None,
    show_default=False,
    help="Bearer token for the coordinator (a runner or admin token; default: "
    ".corral/credentials here).",
)
@option(
    "--config",
    env="CONFIG",
    default="corral.toml",
    type=click.Path(dir_okay=False, path_type=Path),
    help="TOML config with the [actors.<name>] this runner hosts (optional).",
)
@runner_options
@log_format_option
def runner_cmd(url: str, token: str | None, log_format: str, **kwargs: object) -> None:
    """Run a runner: claim runs from the coordinator and execute them."""
    configure_logging(log_format)
    found = client_token(token)
    if found is None:
        raise click.UsageError(
            "no token for the coordinator: pass --token (CORRAL_TOKEN), or start the runner "
            "in the directory of a local coordinator (its .corral/credentials)"
        )
    settings = replace(runner_settings(url, **kwargs), token=found)  # type: ignore[arg-type]

    async def main() -> None:
        runner = RunnerCore(settings)
        runner.install_signal_handlers()
        await runner.run()

    run_loop(main())
