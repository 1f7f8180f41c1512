"""The store's schema as numbered migrations, applied in order and recorded.

Each migration is written once with two dialect placeholders: ``{real}`` (a float column)
and ``{serial}`` (an auto-increment primary key). Timestamps are seconds since the epoch,
lists and mappings are JSON text, so both dialects store the same values.
Migration 2 adds task graphs, 3 the WebSocket runner link, 4 actors' KV, 5 tokens (and the
token each runner registered with), 6 actors: their lifecycle, placements (the single
truth of where an actor runs), the pending queue of each pool and what each runner hosts,
7 the event log (its SQL differs by dialect: a function makes it), 8 pools: serverless
endpoints, the lease of the coordinator scaling each, and their recent errors; 9 several
coordinators on one database: the leases of work done by one of them at a time, and on
PostgreSQL the triggers that wake the others (``corral.store.wakeups``); 10 sub-agent
sessions: a run's parent session, its callback mode and depth, and the callbacks owed to
parents (``corral.store.callbacks``); 11 events of actors, pools and a task's steps, and
each pool's demand as its autoscaler last saw it (``corral.store.event_triggers``); 12 a
drain asked through any coordinator reaches the runner through the one holding its
socket: the grace it was given; 13 agent tokens' run and expiry; 14 the coordinator
holding each runner's socket (the gateway forwards requests for its actors there); 15
the coordinators that are up, and since when (``corral.store.coordinators``); 16 pending
runs by label class, so that a claim reads only the runs its runner can take, and by last
change (``corral.store.claims``); 17 the runner whose lease on a run's attempt ran out,
whose late final report may still end it (``corral.store.claims.reports_late``); 18 on
PostgreSQL the events' ids in a table of their own, and the events as readers see them
(``corral.store.event_triggers.numbering_migration``); 19 runs by session and by task
only for runs that have one; 20 no index of the events by time (retention deletes them
in id order); 21 when a run was lost, and the runs waiting lost for a late report, for the
reconciler that fails them once their grace is over (``corral.store.reconcile``); 22 on
PostgreSQL the event triggers once a statement, not once a row
(``corral.store.event_triggers.statement_migration``).
"""

from __future__ import annotations

import re
from collections.abc import Callable

import corral.store.event_triggers as event_triggers
import corral.store.wakeups as wakeups

_LEASES = """
CREATE TABLE coordinator_leases (
    name       TEXT PRIMARY KEY,
    holder     TEXT NOT NULL,
    expires_at {real} NOT NULL
);
"""

# A run's label class: the runs of one class require the same labels. Its JSON list of labels
# (written sorted), hashed on PostgreSQL, where an index entry may not exceed about 2.7 kB.
LABEL_CLASS = {"sqlite": "labels", "postgres": "md5(labels)"}
# The runner a run requires, '' for any: an equality, which PostgreSQL's planner knows keeps
# the index's order for the columns after it (it does not for ``IS NULL``).
PINNED_TO = "coalesce(required_runner, '')"


# When a pending run last became claimable: written, or its backoff ends (the later).
LAST_CHANGE = {
    "sqlite": "max(available_at, updated_at)",
    "postgres": "greatest(available_at, updated_at)",
}


def _pending_backlog(dialect: str) -> str:
    # Pending runs by class, then the runner they require, in the order claims take them: a
    # claim reads the classes its runner fits and, in each, the runs in order; a backlog of
    # runs it cannot take is never read (corral.store.claims). And by last change: the
    # reconciler's look for runs claimable since its last one reads only those.
    return (
        f"CREATE INDEX runs_pending_by_class ON runs ({LABEL_CLASS[dialect]}, {PINNED_TO}, "
        "priority DESC, created_at, id) WHERE status = 'pending';\n"
        f"CREATE INDEX runs_pending_by_change ON runs ({LAST_CHANGE[dialect]}) "
        "WHERE status = 'pending';\n"
    )


MIGRATIONS: list[tuple[int, str | Callable[[str], str]]] = [
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
    (
        2,
        """
CREATE TABLE projects (
    id             TEXT PRIMARY KEY,
    repo_path      TEXT NOT NULL,
    target_branch  TEXT NOT NULL,
    merge_strategy TEXT NOT NULL DEFAULT 'merge',
    on_no_changes  TEXT NOT NULL DEFAULT 'fail',
    setup_command  TEXT,
    workers        INTEGER NOT NULL DEFAULT 0,
    paused         INTEGER NOT NULL DEFAULT 0,
    pause_reason   TEXT,
    budget_usd     {real},
    cost_usd       {real} NOT NULL DEFAULT 0,
    retry_backoff_s {real} NOT NULL DEFAULT 2,
    resolve_conflicts INTEGER NOT NULL DEFAULT 0,
    plan_digest    TEXT,
    created_at     {real} NOT NULL,
    updated_at     {real} NOT NULL,
    UNIQUE (repo_path, target_branch)
);

CREATE TABLE tasks (
    id                 TEXT PRIMARY KEY,
    project_id         TEXT NOT NULL REFERENCES projects (id),
    key                TEXT NOT NULL,
    seq                INTEGER NOT NULL,
    title              TEXT NOT NULL,
    prompt             TEXT NOT NULL,
    priority           INTEGER NOT NULL DEFAULT 0,
    labels             TEXT NOT NULL,
    agent              TEXT,
    max_attempts       INTEGER NOT NULL,
    attempts           INTEGER NOT NULL DEFAULT 0,
    budget_usd         {real},
    cost_usd           {real} NOT NULL DEFAULT 0,
    status             TEXT NOT NULL,
    remaining_blockers INTEGER NOT NULL DEFAULT 0,
    run_id             TEXT,
    steps              TEXT NOT NULL DEFAULT '{{}}',
    conflict           TEXT,
    conflict_retries   INTEGER NOT NULL DEFAULT 0,
    last_error         TEXT,
    session_id         TEXT,
    commit_sha         TEXT,
    merge_sha          TEXT,
    worktree_kept      TEXT,
    available_at       {real} NOT NULL,
    created_at         {real} NOT NULL,
    updated_at         {real} NOT NULL,
    started_at         {real},
    finished_at        {real},
    UNIQUE (project_id, key)
);
CREATE INDEX tasks_ready ON tasks (project_id, priority DESC, seq)
    WHERE status = 'ready';

CREATE TABLE task_dependencies (
    task_id    TEXT NOT NULL REFERENCES tasks (id),
    blocked_by TEXT NOT NULL REFERENCES tasks (id),
    PRIMARY KEY (task_id, blocked_by)
);
CREATE INDEX task_dependencies_by_blocker ON task_dependencies (blocked_by);

ALTER TABLE runs ADD COLUMN task_id TEXT REFERENCES tasks (id);
CREATE INDEX runs_by_task ON runs (task_id);
""",
    ),
    (
        3,
        """
CREATE TABLE runner_commands (
    runner_id  TEXT NOT NULL,
    idx        INTEGER NOT NULL,
    body       TEXT NOT NULL,
    created_at {real} NOT NULL,
    PRIMARY KEY (runner_id, idx)
);
ALTER TABLE runners ADD COLUMN next_command_idx INTEGER NOT NULL DEFAULT 1;
ALTER TABLE runners ADD COLUMN acked_command_idx INTEGER NOT NULL DEFAULT 0;
ALTER TABLE runners ADD COLUMN last_event_idx INTEGER NOT NULL DEFAULT 0;
ALTER TABLE runners ADD COLUMN lost_after_s {real};
""",
    ),
    (
        4,
        """
CREATE TABLE actor_kv (
    actor_id   TEXT NOT NULL,
    key        TEXT {binary} NOT NULL,
    value      TEXT NOT NULL,
    updated_at {real} NOT NULL,
    PRIMARY KEY (actor_id, key)
);
""",
    ),
    (
        5,
        """
CREATE TABLE tokens (
    id          TEXT PRIMARY KEY,
    name        TEXT NOT NULL,
    role        TEXT NOT NULL,
    token_hash  TEXT NOT NULL UNIQUE,
    labels      TEXT,
    created_at  {real} NOT NULL,
    revoked_at  {real}
);
ALTER TABLE runners ADD COLUMN token_id TEXT;
""",
    ),
    (
        6,
        """
CREATE TABLE actors (
    id                    TEXT PRIMARY KEY,
    name                  TEXT NOT NULL,
    key                   TEXT,
    input                 TEXT,
    pool                  TEXT NOT NULL,
    crash_policy          TEXT NOT NULL,
    state                 TEXT NOT NULL,
    generation            INTEGER NOT NULL DEFAULT 0,
    will_wake             INTEGER NOT NULL DEFAULT 0,
    going_away            INTEGER NOT NULL DEFAULT 0,
    destroying            INTEGER NOT NULL DEFAULT 0,
    restarts              INTEGER NOT NULL DEFAULT 0,
    last_restart_at       {real},
    deadline_at           {real},
    alarm_at              {real},
    next_at               {real},
    created_at            {real} NOT NULL,
    started_at            {real},
    pending_allocation_at {real},
    connectable_at        {real},
    sleep_at              {real},
    reschedule_at         {real},
    destroyed_at          {real},
    updated_at            {real} NOT NULL,
    UNIQUE (name, key)
);
CREATE INDEX actors_by_created ON actors (created_at, id);
CREATE INDEX actors_timers ON actors (next_at) WHERE next_at IS NOT NULL;

CREATE TABLE actor_placements (
    actor_id   TEXT PRIMARY KEY REFERENCES actors (id),
    runner_id  TEXT NOT NULL,
    generation INTEGER NOT NULL,
    placed_at  {real} NOT NULL
);
CREATE INDEX actor_placements_by_runner ON actor_placements (runner_id);

CREATE TABLE actor_queue (
    seq       {serial},
    pool      TEXT NOT NULL,
    actor_id  TEXT NOT NULL UNIQUE REFERENCES actors (id),
    queued_at {real} NOT NULL
);
CREATE INDEX actor_queue_by_pool ON actor_queue (pool, seq);

CREATE TABLE actor_hosts (
    runner_id TEXT PRIMARY KEY,
    pool      TEXT NOT NULL,
    names     TEXT NOT NULL,
    slots     INTEGER NOT NULL
);
CREATE INDEX actor_hosts_by_pool ON actor_hosts (pool);
""",
    ),
    # The event log and the triggers that write it (corral.store.event_triggers).
    (7, event_triggers.migration),
    (
        8,
        """
CREATE TABLE pools (
    name         TEXT PRIMARY KEY,
    serverless   TEXT,
    scaler       TEXT,
    scaler_until {real},
    created_at   {real} NOT NULL,
    updated_at   {real} NOT NULL
);
CREATE TABLE pool_errors (
    id      {serial},
    pool    TEXT NOT NULL,
    kind    TEXT NOT NULL,
    message TEXT NOT NULL,
    at      {real} NOT NULL
);
CREATE INDEX pool_errors_by_pool ON pool_errors (pool, id);
""",
    ),
    (9, lambda dialect: render(_LEASES, dialect) + wakeups.migration(dialect)),
    (
        10,
        """
ALTER TABLE runs ADD COLUMN parent_session_id TEXT;
ALTER TABLE runs ADD COLUMN callback TEXT;
ALTER TABLE runs ADD COLUMN depth INTEGER NOT NULL DEFAULT 0;
CREATE INDEX runs_by_parent ON runs (parent_session_id) WHERE parent_session_id IS NOT NULL;

-- One row per child that ended owing its parent a callback (the key makes it one), written
-- in the transaction that ends the child; delivered (the resume run that carried it) or
-- dropped (why) once, by a guarded update in the transaction that writes the resume.
-- No foreign keys: retention may delete the runs of settled callbacks (never pending ones).
CREATE TABLE run_callbacks (
    child_run_id      TEXT PRIMARY KEY,
    parent_session_id TEXT NOT NULL,
    finished_at       {real} NOT NULL,
    delivered_run_id  TEXT,
    dropped           TEXT,
    settled_at        {real}
);
CREATE INDEX run_callbacks_pending ON run_callbacks (finished_at)
    WHERE delivered_run_id IS NULL AND dropped IS NULL;
""",
    ),
    (11, event_triggers.actor_migration),
    (
        12,
        # A drain asked of the runner (POST /runners/{id}/drain): the seconds from drain_at
        # it was given to finish. NULL while it drains of itself (it said it stops), or not.
        "ALTER TABLE runners ADD COLUMN drain_grace_s {real};\n",
    ),
    (
        13,
        """
-- Agent tokens (corral.tokens): minted for one attempt of a run, live while it holds it.
ALTER TABLE tokens ADD COLUMN run_id TEXT;
ALTER TABLE tokens ADD COLUMN run_attempt INTEGER;
ALTER TABLE tokens ADD COLUMN expires_at {real};
""",
    ),
    (
        14,
        # The URL of the coordinator that registered the runner's socket last (its
        # advertised URL): the gateway of another coordinator forwards requests there.
        "ALTER TABLE runners ADD COLUMN coordinator_url TEXT;\n",
    ),
    (
        15,
        # Each coordinator process: up from up_since (its start) to seen_at (its last
        # reconciler pass). A runner is lost only when one was up to hear it.
        """
CREATE TABLE coordinators (
    node     TEXT PRIMARY KEY,
    up_since {real} NOT NULL,
    seen_at  {real} NOT NULL
);
""",
    ),
    (16, _pending_backlog),
    (
        17,
        # The runner that held the run's current attempt when it was taken back (lost, or
        # no longer reported): its late final report of that attempt may still end the run
        # while it waits at pending, unclaimed since. Meaningless once a claim counts a new
        # attempt; NULL when the run went back to pending otherwise (given back).
        "ALTER TABLE runs ADD COLUMN lost_runner_id TEXT;\n",
    ),
    (18, event_triggers.numbering_migration),
    (
        19,
        # Only runs that have a session, or a task, are looked up by it: a command's run
        # (neither) is no entry of these indexes. Each entry cost a run's creation ~1.6 µs
        # of the coordinator's CPU on SQLite, and its page of the index.
        """
DROP INDEX runs_by_session;
CREATE INDEX runs_by_session ON runs (session_id) WHERE session_id IS NOT NULL;
DROP INDEX runs_by_task;
CREATE INDEX runs_by_task ON runs (task_id) WHERE task_id IS NOT NULL;
""",
    ),
    # Retention deletes events in id order (``EventStore.collect``): an index on their
    # time cost each event one more entry to write, for a pass an hour.
    (20, "DROP INDEX events_by_at;\n"),
    (
        21,
        # When the run was last lost (its runner gone, or no longer reporting it). A run lost
        # with no attempt left waits in status lost for its runner's late final report, a
        # grace counted from then; the reconciler looks for those whose grace is over each
        # second, through the index of the (few) runs waiting lost.
        """
ALTER TABLE runs ADD COLUMN lost_at {real};
CREATE INDEX runs_lost ON runs (lost_at) WHERE status = 'lost';
""",
    ),
    (22, event_triggers.statement_migration),
    (
        23,
        # Idempotency keys of the requests that created runs (``run_requests.py``).
        """
CREATE TABLE run_requests (
    scope      TEXT {binary} NOT NULL,
    key        TEXT {binary} NOT NULL,
    digest     TEXT NOT NULL,
    run_ids    TEXT NOT NULL,
    created_at {real} NOT NULL,
    PRIMARY KEY (scope, key)
);
CREATE INDEX run_requests_by_age ON run_requests (created_at);
""",
    ),
    (24, wakeups.quiet_claims_migration),
]

LATEST_VERSION = MIGRATIONS[-1][0]


def render(sql: str | Callable[[str], str], dialect: str) -> str:
    """A migration for ``dialect``: its text with the placeholders filled, or what its
    function makes (a migration whose SQL differs by dialect, like the event triggers)."""
    if callable(sql):
        return sql(dialect)
    # {binary}: text compared byte by byte (SQLite's default), so keys sort the same on both.
    if dialect == "sqlite":
        return sql.format(real="REAL", serial="INTEGER PRIMARY KEY AUTOINCREMENT", binary="")
    return sql.format(real="DOUBLE PRECISION", serial="BIGSERIAL PRIMARY KEY", binary='COLLATE "C"')


def statements(sql: str) -> list[str]:
    """Split a migration into statements: each ends with ';' at the end of a line (a
    trigger's body holds its own ';' inside the line; none of ours is in a literal)."""
    return [part.strip() for part in re.split(r";[ \t]*(?:\n|$)", sql) if part.strip()]
