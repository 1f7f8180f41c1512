"""Agent profiles without a restart (issue 15): SIGHUP makes the coordinator read
corral.toml again, ``corral agents list`` shows what is loaded, and a config that does not
load keeps the profiles it had."""

from __future__ import annotations

import signal

from e2e_support import Cluster, wait_until


def _agents(cluster: Cluster) -> list[str]:
    done = cluster.cli("agents", "list")
    assert done.returncode == 0, done.stderr
    return [line.split()[0] for line in done.stdout.splitlines()[1:]]


def test_sighup_reloads_agent_profiles(cluster: Cluster) -> None:
    config = cluster.root / "coordinator" / "corral.toml"  # the default: in its directory
    config.parent.mkdir(parents=True)
    config.write_text('[agents.first]\nexecutor = "claude"\nmodel = "sonnet"\n')
    coordinator = cluster.start_coordinator()
    assert coordinator.cwd == config.parent
    assert _agents(cluster) == ["claude", "first"]

    refused = cluster.cli("start", "--agent", "second", "hi")
    assert refused.returncode == 2 and "unknown_agent" in refused.stderr

    config.write_text(config.read_text() + '[agents.second]\nexecutor = "claude"\n')
    coordinator.send(signal.SIGHUP)
    wait_until(lambda: "second" in _agents(cluster), what="the new profile to be loaded")
    accepted = cluster.cli("start", "--agent", "second", "hi")
    assert accepted.returncode == 0, accepted.stderr

    config.write_text("[agents.broken\n")
    coordinator.send(signal.SIGHUP)
    wait_until(lambda: "not reloaded" in coordinator.log(), what="the refusal to be logged")
    assert _agents(cluster) == ["claude", "first", "second"]
    assert coordinator.alive()
