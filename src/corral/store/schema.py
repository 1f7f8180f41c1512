"""The store's schema as numbered migrations, applied in order and recorded.

Each migration is written once with two dialect placeholders: ``{real}`` (a float column)
and ``{serial}`` (an auto-increment primary key). Timestamps are seconds since the epoch,
lists and mappings are JSON text, so both dialects store the same values.
Tables for tasks and actors come in later migrations.
"""

from __future__ import annotations

MIGRATIONS: list[tuple[int, str]] = [
    (
        1,
        """
CREATE TABLE runners (
    id                TEXT PRIMARY KEY,
    name              TEXT NOT NULL,
    hostname          TEXT NOT NULL,
    labels            TEXT NOT NULL,
    slots             INTEGER NOT NULL,
    version           TEXT NOT NULL,
    transport         TEXT NOT NULL,
    state             TEXT NOT NULL,
    registered_at     {real} NOT NULL,
    last_heartbeat_at {real} NOT NULL,
    drain_at          {real},
    stopped_at        {real}
);

CREATE TABLE runs (
    id                 TEXT PRIMARY KEY,
    type               TEXT NOT NULL,
    status             TEXT NOT NULL,
    prompt             TEXT,
    command            TEXT NOT NULL,
    session_name       TEXT,
    session_id         TEXT,
    agent              TEXT,
    project_dir        TEXT,
    labels             TEXT NOT NULL,
    env                TEXT NOT NULL,
    timeout_s          {real},
    idle_timeout_s     {real},
    max_attempts       INTEGER NOT NULL,
    attempts           INTEGER NOT NULL DEFAULT 0,
    priority           INTEGER NOT NULL DEFAULT 0,
    required_runner    TEXT,
    runner_id          TEXT REFERENCES runners (id),
    exit_code          INTEGER,
    error              TEXT,
    result             TEXT,
    cost_usd           {real},
    usage              TEXT,
    num_turns          INTEGER,
    cancel_requested   INTEGER NOT NULL DEFAULT 0,
    rate_limited       INTEGER NOT NULL DEFAULT 0,
    available_at       {real} NOT NULL,
    created_at         {real} NOT NULL,
    claimed_at         {real},
    started_at         {real},
    finished_at        {real},
    updated_at         {real} NOT NULL
);

-- Only pending rows are ever claimed: keep that index small.
CREATE INDEX runs_claimable ON runs (priority DESC, created_at, id) WHERE status = 'pending';
CREATE INDEX runs_held ON runs (runner_id) WHERE status IN ('claimed', 'running');
CREATE INDEX runs_by_created ON runs (created_at, id);
CREATE INDEX runs_by_session ON runs (session_id);

CREATE TABLE sessions (
    id           TEXT PRIMARY KEY,
    name         TEXT,
    agent_name   TEXT,
    runner_id    TEXT REFERENCES runners (id),
    project_dir  TEXT,
    last_run_id  TEXT REFERENCES runs (id),
    result       TEXT,
    is_error     INTEGER NOT NULL DEFAULT 0,
    cost_usd     {real} NOT NULL DEFAULT 0,
    runs         INTEGER NOT NULL DEFAULT 0,
    created_at   {real} NOT NULL,
    updated_at   {real} NOT NULL
);
CREATE INDEX sessions_by_name ON sessions (name, updated_at);

CREATE TABLE run_logs (
    id       {serial},
    run_id   TEXT NOT NULL REFERENCES runs (id),
    attempt  INTEGER NOT NULL,
    line_no  INTEGER NOT NULL,
    stream   TEXT NOT NULL,
    text     TEXT NOT NULL,
    ts       {real} NOT NULL,
    UNIQUE (run_id, attempt, line_no)
);
""",
    ),
]

LATEST_VERSION = MIGRATIONS[-1][0]


def render(sql: str, dialect: str) -> str:
    if dialect == "sqlite":
        return sql.format(real="REAL", serial="INTEGER PRIMARY KEY AUTOINCREMENT")
    return sql.format(real="DOUBLE PRECISION", serial="BIGSERIAL PRIMARY KEY")


def statements(sql: str) -> list[str]:
    """Split a migration into statements (none of ours has a ';' inside a literal)."""
    return [part.strip() for part in sql.split(";") if part.strip()]
