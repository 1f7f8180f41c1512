"""Tokens end to end: a coordinator started without ``CORRAL_TOKEN`` writes its own admin
token to ``.corral/credentials`` (0600), the CLI and a runner started in that directory find
it, anywhere else they need a token; ``corral tokens`` creates, lists and revokes tokens;
``CORRAL_TOKEN`` is what a coordinator accepts and a CLI or runner sends (issue 9 §2)."""

from __future__ import annotations

import json
import stat
import subprocess
from pathlib import Path

from e2e_support import CORRAL, Cluster, Coordinator, Runner, free_port, wait_until

from corral.client import Client


def corral(env: dict[str, str], cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [CORRAL, *args],
        env=env,
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_local_credentials_need_no_setup(cluster: Cluster, tmp_path: Path) -> None:
    env = {k: v for k, v in cluster.env.items() if k != "CORRAL_TOKEN"}
    site = Coordinator("site", env, cluster.root, port=free_port(), db=str(tmp_path / "s.db"))
    cluster.procs.append(site)
    site.start()
    site.wait_ready()
    here = site.cwd  # the coordinator's working directory
    credentials = here / ".corral" / "credentials"
    assert stat.S_IMODE(credentials.stat().st_mode) == 0o600
    admin = credentials.read_text().strip()
    assert admin not in site.log()  # never printed

    # A runner started in that directory finds the token, and so does the CLI.
    runner = Runner("local", env, cluster.root, url=site.url, slots=1)
    runner.cwd = here
    cluster.procs.append(runner)
    runner.start()
    env = {**env, "CORRAL_URL": site.url}
    done = corral(env, here, "run", "--wait", "--", "sh", "-c", "echo authenticated")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["authenticated"]

    # Elsewhere, without a token: refused, with a message saying what to do.
    elsewhere = corral(env, tmp_path, "runs", "list")
    assert elsewhere.returncode == 6, elsewhere
    assert "[unauthorized]" in elsewhere.stderr and "CORRAL_TOKEN" in elsewhere.stderr
    no_token = corral(env, tmp_path, "runner", "--name", "lost", "--slots", "1")
    assert no_token.returncode != 0 and "no token" in no_token.stderr

    # A restart keeps the same token: nothing to hand out again.
    site.kill()
    site.start()
    site.wait_ready()
    assert credentials.read_text().strip() == admin
    assert corral(env, here, "runs", "list").returncode == 0


def test_tokens_are_created_listed_and_revoked_from_the_cli(cluster: Cluster) -> None:
    coordinator = cluster.start_coordinator()
    env = {**cluster.env, "CORRAL_URL": coordinator.url}
    made = corral(env, cluster.root, "tokens", "create", "--role", "reader", "--name", "dash")
    assert made.returncode == 0, made.stderr
    reader = made.stdout.strip()
    token_id = made.stderr.split()[0]
    assert token_id.startswith("tok_") and reader.startswith("crl_")

    as_reader = {**env, "CORRAL_TOKEN": reader}
    assert corral(as_reader, cluster.root, "runs", "list").returncode == 0
    refused = corral(as_reader, cluster.root, "run", "--", "true")
    assert refused.returncode == 7 and "[forbidden]" in refused.stderr
    refused = corral(as_reader, cluster.root, "tokens", "list")
    assert refused.returncode == 7

    listed = corral(env, cluster.root, "tokens", "list", "--json")
    assert listed.returncode == 0
    (entry,) = json.loads(listed.stdout)
    assert (entry["token_id"], entry["role"], entry["name"]) == (token_id, "reader", "dash")
    assert reader not in listed.stdout

    assert corral(env, cluster.root, "tokens", "revoke", token_id).returncode == 0
    revoked = corral(as_reader, cluster.root, "runs", "list")
    assert revoked.returncode == 6 and "[invalid_token]" in revoked.stderr


def test_corral_token_is_what_the_coordinator_accepts(cluster: Cluster) -> None:
    coordinator = cluster.start_coordinator()  # CORRAL_TOKEN set: no credentials file
    assert not (coordinator.cwd / ".corral" / "credentials").exists()
    wrong = {**cluster.env, "CORRAL_URL": coordinator.url, "CORRAL_TOKEN": "crl_wrong"}
    refused = corral(wrong, cluster.root, "runs", "list")
    assert refused.returncode == 6 and "[invalid_token]" in refused.stderr
    # A runner with the wrong token is never registered (it says why in its log).
    stray = Runner("stray", wrong, cluster.root, url=coordinator.url, slots=1)
    cluster.procs.append(stray)
    stray.start()
    wait_until(lambda: "revoked token" in stray.log(), 30, what="the runner to be refused")
    with Client(coordinator.url, token=cluster.env["CORRAL_TOKEN"]) as client:
        assert client.list_runners() == []
    # With the right one it is.
    cluster.start_runner("right")
