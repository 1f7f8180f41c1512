"""Wake-ups between coordinators sharing one PostgreSQL database: triggers that ``NOTIFY``.

A coordinator wakes its own waiters in process (``corral.coordinator.notifier``); one
beside it on the same database hears of a change through these triggers, which send the
notifier's topic in the transaction that made the change — so a notification is delivered
exactly when the change is committed, whoever wrote it (a coordinator, a CLI, a script):

    runs      inserted pending, or put back to pending     ──▶  runs
              a cancel requested of a held run              ──▶  runner:<its runner>
              finished (a log follower's end)               ──▶  logs:<run>
    run_logs  lines inserted                                ──▶  logs:<run>
    runner_commands  commands stored for a runner           ──▶  runner:<runner>
    runners   state changed (drained, lost, stopped)        ──▶  runner:<runner>
    actors    state changed                                 ──▶  actor:<actor>

The channel is per schema (``corral_<schema>``: several corral databases may live in one
PostgreSQL database), and the payload is ``<node> <topic>``, ``<node>`` being the
``corral.node`` setting of the writing connection: a coordinator sets it on each of its
connections and ignores its own notifications (it has woken its waiters already).
SQLite has one coordinator per file (``corral.coordinator.sole``): nothing to send.
"""

from __future__ import annotations

CHANNEL_PREFIX = "corral_"
NODE_SETTING = "corral.node"


def _function(name: str, body: str) -> str:
    return (
        f"CREATE FUNCTION {name}() RETURNS trigger LANGUAGE plpgsql AS "
        f"$$ BEGIN {body} RETURN NULL; END $$"
    )


def _wake_each(topic: str, column: str) -> str:
    """A statement trigger's body: one wake-up per distinct ``column`` of inserted rows."""
    return (
        f"PERFORM corral_wake('{topic}:' || {column}) "
        f"FROM (SELECT DISTINCT {column} FROM inserted) AS changed;"
    )


_STATEMENTS = [
    "CREATE FUNCTION corral_wake(topic TEXT) RETURNS void LANGUAGE sql AS $$ "
    f"SELECT pg_notify('{CHANNEL_PREFIX}' || current_schema(), "
    f"COALESCE(current_setting('{NODE_SETTING}', true), '') || ' ' || topic) $$",
    _function(
        "corral_wake_runs",
        "IF NEW.status = 'pending' THEN PERFORM corral_wake('runs'); "
        "ELSIF NEW.status NOT IN ('claimed', 'running') THEN "
        "PERFORM corral_wake('logs:' || NEW.id); END IF; "
        "IF TG_OP = 'UPDATE' AND NEW.cancel_requested <> OLD.cancel_requested "
        "AND NEW.runner_id IS NOT NULL THEN PERFORM corral_wake('runner:' || NEW.runner_id); "
        "PERFORM corral_wake('logs:' || NEW.id); END IF;",
    ),
    "CREATE TRIGGER corral_wake_runs_insert AFTER INSERT ON runs FOR EACH ROW "
    "WHEN (NEW.status = 'pending') EXECUTE FUNCTION corral_wake_runs()",
    "CREATE TRIGGER corral_wake_runs_update AFTER UPDATE ON runs FOR EACH ROW "
    "WHEN (OLD.status IS DISTINCT FROM NEW.status "
    "OR OLD.cancel_requested IS DISTINCT FROM NEW.cancel_requested) "
    "EXECUTE FUNCTION corral_wake_runs()",
    _function("corral_wake_logs", _wake_each("logs", "run_id")),
    "CREATE TRIGGER corral_wake_logs AFTER INSERT ON run_logs REFERENCING NEW TABLE AS "
    "inserted FOR EACH STATEMENT EXECUTE FUNCTION corral_wake_logs()",
    _function("corral_wake_commands", _wake_each("runner", "runner_id")),
    "CREATE TRIGGER corral_wake_commands AFTER INSERT ON runner_commands REFERENCING NEW "
    "TABLE AS inserted FOR EACH STATEMENT EXECUTE FUNCTION corral_wake_commands()",
    _function("corral_wake_runner", "PERFORM corral_wake('runner:' || NEW.id);"),
    "CREATE TRIGGER corral_wake_runner AFTER UPDATE ON runners FOR EACH ROW "
    "WHEN (OLD.state IS DISTINCT FROM NEW.state) EXECUTE FUNCTION corral_wake_runner()",
    _function("corral_wake_actor", "PERFORM corral_wake('actor:' || NEW.id);"),
    "CREATE TRIGGER corral_wake_actor AFTER UPDATE ON actors FOR EACH ROW "
    "WHEN (OLD.state IS DISTINCT FROM NEW.state) EXECUTE FUNCTION corral_wake_actor()",
]


def migration(dialect: str) -> str:
    """The triggers on PostgreSQL; nothing on SQLite. Every statement on one line."""
    return "".join(f"{s};\n" for s in _STATEMENTS) if dialect == "postgres" else ""


# Migration 24: the runs' update trigger is called only for a change ``corral_wake_runs``
# sends something for: a status other than claimed or running (pending: ``runs``; any
# other: ``logs:<run>``), or a cancel requested of a run a runner holds. Its condition was
# any change of status or of cancel_requested, so a claim and a start called the plpgsql
# function for nothing, once a run.
_WAKE_RUNS_UPDATE = (
    "CREATE TRIGGER corral_wake_runs_update AFTER UPDATE ON runs FOR EACH ROW "
    "WHEN ((OLD.status IS DISTINCT FROM NEW.status "
    "OR OLD.cancel_requested IS DISTINCT FROM NEW.cancel_requested) "
    "AND (NEW.status NOT IN ('claimed', 'running') "
    "OR (NEW.cancel_requested <> OLD.cancel_requested AND NEW.runner_id IS NOT NULL))) "
    "EXECUTE FUNCTION corral_wake_runs()"
)


def quiet_claims_migration(dialect: str) -> str:
    """Migration 24 (PostgreSQL only): ``_WAKE_RUNS_UPDATE`` replaces the trigger."""
    if dialect != "postgres":
        return ""
    return f"DROP TRIGGER corral_wake_runs_update ON runs;\n{_WAKE_RUNS_UPDATE};\n"


def channel(schema: str) -> str:
    """The channel a coordinator whose tables live in ``schema`` listens on."""
    return CHANNEL_PREFIX + schema
