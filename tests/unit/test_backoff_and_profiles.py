"""Retry delays (``corral.backoff``) and agent profiles from TOML (``corral.agents.profiles``)."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from corral.agents.profiles import BUILTIN, load_profiles, resolve
from corral.backoff import backoff_delay
from corral.errors import InvalidRequest, UnknownAgent
from corral.runs import AgentSpec


class FixedDraw(random.Random):
    """An rng whose every draw is ``value``: the delay's jitter becomes exact."""

    def __init__(self, value: float) -> None:
        super().__init__()
        self.value = value

    def random(self) -> float:
        return self.value


# ---- backoff ---------------------------------------------------------------------------------


def test_backoff_grows_exponentially_from_base() -> None:
    no_jitter = FixedDraw(0.0)
    delays = [backoff_delay(n, base=0.5, cap=1000, rng=no_jitter) for n in range(6)]
    assert delays == [0.5, 1.0, 2.0, 4.0, 8.0, 16.0]


def test_backoff_is_capped() -> None:
    no_jitter = FixedDraw(0.0)
    assert backoff_delay(10, base=0.5, cap=30, rng=no_jitter) == 30
    assert backoff_delay(6, base=0.5, cap=30, rng=no_jitter) == 30  # 32 > cap
    assert backoff_delay(5, base=0.5, cap=30, rng=no_jitter) == 16
    # A huge attempt number neither overflows nor passes the cap (plus its jitter).
    assert backoff_delay(10_000, base=0.5, cap=30, rng=FixedDraw(0.0)) == 30
    assert backoff_delay(10_000, cap=30, rng=FixedDraw(0.999)) <= 30 * 1.25


@pytest.mark.parametrize("attempt", [0, 1, 3, 7, 20])
def test_jitter_adds_between_0_and_25_percent(attempt: int) -> None:
    plain = backoff_delay(attempt, rng=FixedDraw(0.0))
    assert backoff_delay(attempt, rng=FixedDraw(0.5)) == pytest.approx(plain * 1.125)
    rng = random.Random(attempt)
    for _ in range(200):
        delay = backoff_delay(attempt, rng=rng)
        assert plain <= delay <= plain * 1.25


def test_a_delay_drawn_without_a_generator_leaves_the_global_one_alone() -> None:
    """Retry loops in background threads draw their jitter; a property test running beside
    them treats any change of the global ``random`` state as misuse of it, and fails."""
    before = random.getstate()
    delays = {backoff_delay(3) for _ in range(50)}
    assert random.getstate() == before
    assert len(delays) > 1 and all(4.0 <= d <= 5.0 for d in delays)  # still jittered


def test_jitter_is_configurable() -> None:
    assert backoff_delay(2, jitter=0.0, rng=random.Random(1)) == 2.0
    assert backoff_delay(2, jitter=1.0, rng=FixedDraw(0.5)) == 3.0


def test_seeded_rng_is_reproducible() -> None:
    first = [backoff_delay(n, rng=random.Random(42)) for n in range(8)]
    second = [backoff_delay(n, rng=random.Random(42)) for n in range(8)]
    assert first == second
    one_rng, other_rng = random.Random(7), random.Random(7)
    assert [backoff_delay(3, rng=one_rng) for _ in range(5)] == [
        backoff_delay(3, rng=other_rng) for _ in range(5)
    ]
    assert len({backoff_delay(3, rng=random.Random(s)) for s in range(10)}) > 1


def test_backoff_without_rng_stays_in_bounds() -> None:
    for _ in range(50):
        assert 4.0 <= backoff_delay(3) <= 5.0


# ---- profiles --------------------------------------------------------------------------------


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "corral.toml"
    path.write_text(text)
    return path


def test_builtin_claude_without_config(tmp_path: Path) -> None:
    expected = {"claude": AgentSpec(name="claude", executor="claude")}
    assert load_profiles(None) == expected
    assert load_profiles(tmp_path / "missing.toml") == expected
    assert load_profiles(write(tmp_path, "[server]\nport = 1\n")) == expected
    assert expected == BUILTIN


def test_a_toml_profile_with_every_field(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """
[agents.researcher]
executor = "claude"
model = "sonnet"
allowed_tools = ["Read", "Grep", "WebSearch"]
system_prompt = "You research things carefully."
max_turns = 20
budget_usd = 2.5
extra_args = ["--verbose"]
env = { RESEARCH_MODE = "deep" }

[agents.minimal]
""",
    )
    profiles = load_profiles(path)
    assert set(profiles) == {"claude", "researcher", "minimal"}
    assert profiles["researcher"] == AgentSpec(
        name="researcher",
        executor="claude",
        model="sonnet",
        allowed_tools=("Read", "Grep", "WebSearch"),
        system_prompt="You research things carefully.",
        max_turns=20,
        budget_usd=2.5,
        extra_args=("--verbose",),
        env={"RESEARCH_MODE": "deep"},
    )
    assert profiles["minimal"] == AgentSpec(name="minimal", executor="claude")
    assert profiles["claude"] == BUILTIN["claude"]
    assert AgentSpec.from_dict(profiles["researcher"].to_dict()) == profiles["researcher"]


def test_a_profile_may_redefine_claude(tmp_path: Path) -> None:
    profiles = load_profiles(write(tmp_path, '[agents.claude]\nmodel = "opus"\n'))
    assert profiles["claude"] == AgentSpec(name="claude", executor="claude", model="opus")


def test_an_integer_budget_is_accepted(tmp_path: Path) -> None:
    assert load_profiles(write(tmp_path, "[agents.a]\nbudget_usd = 3\n"))["a"].budget_usd == 3


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('[agents.x]\nmodle = "sonnet"\n', r"\[agents\.x\]: unknown keys \['modle'\]"),
        ('[agents.x]\nexecutor = "codex"\n', r"\[agents\.x\]: unknown executor 'codex'"),
        ("[agents.x\nmodel = 1\n", r"cannot read config .*corral\.toml"),
        ('model = "unterminated\n', r"cannot read config"),
        ("agents = 3\n", r"\[agents\] must be a table"),
        ("[agents]\nx = 3\n", r"\[agents\.x\] must be a table"),
        ('[agents.x]\nallowed_tools = "Read"\n', r"\[agents\.x\]: allowed_tools must be a list"),
        ("[agents.x]\nextra_args = [1]\n", r"extra_args must be a list of strings"),
        ("[agents.x]\nenv = { A = 1 }\n", r"env must be a table of strings"),
        ('[agents.x]\nenv = "A=1"\n', r"env must be a table of strings"),
        ('[agents.x]\nmax_turns = "ten"\n', r"max_turns must be an integer"),
        ("[agents.x]\nmax_turns = 2.5\n", r"max_turns must be an integer"),
        ('[agents.x]\nbudget_usd = "lots"\n', r"budget_usd must be a number"),
        ("[agents.x]\nbudget_usd = true\n", r"budget_usd must be a number"),
        ("[agents.x]\nmodel = 4\n", r"model must be a string"),
    ],
    ids=[
        "unknown-key",
        "unknown-executor",
        "bad-toml",
        "bad-toml-string",
        "agents-not-a-table",
        "profile-not-a-table",
        "tools-a-string",
        "args-not-strings",
        "env-not-strings",
        "env-a-string",
        "turns-a-string",
        "turns-a-float",
        "budget-a-string",
        "budget-a-bool",
        "model-a-number",
    ],
)
def test_a_bad_config_is_refused_clearly(tmp_path: Path, text: str, message: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(InvalidRequest, match=message) as caught:
        load_profiles(path)
    assert caught.value.code == "invalid_request"
    assert str(path) in caught.value.message  # says which file


def test_resolve_defaults_to_claude() -> None:
    profiles = load_profiles(None)
    assert resolve(profiles, None) is profiles["claude"]
    assert resolve(profiles, "") is profiles["claude"]
    assert resolve(profiles, "claude") is profiles["claude"]


def test_resolve_of_an_unknown_agent_lists_the_known_ones(tmp_path: Path) -> None:
    profiles = load_profiles(write(tmp_path, "[agents.zeta]\n[agents.alpha]\n"))
    with pytest.raises(UnknownAgent) as caught:
        resolve(profiles, "nobody")
    error = caught.value
    assert isinstance(error, InvalidRequest)
    assert error.code == "unknown_agent"
    assert error.http_status == 422
    assert "'nobody'" in error.message
    assert "known agents: alpha, claude, zeta" in error.message
