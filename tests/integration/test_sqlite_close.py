"""Closing the SQLite database while another thread is inside a transaction: ``close``
waits for it (bounded) instead of closing a connection under a running statement, which
crashed the process in sqlite3 (SIGSEGV: a ``tasks run`` whose event pump was reading the
log as the process stopped). Run in a child process, so that a crash fails the test."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SCRIPT = """
import sys, threading
from pathlib import Path
from corral.store.db import SqliteDatabase

db = SqliteDatabase(Path(sys.argv[1]))
with db.transaction() as tx:
    tx.execute(
        "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < 300000) "
        "SELECT COUNT(*) FROM c"
    )
inside = threading.Event()
found = []

def read():
    db._conn().create_function("inside", 0, lambda: inside.set() or 1)
    with db.transaction(write=False) as tx:
        found.append(tx.tuples(
            "WITH RECURSIVE c(x) AS (SELECT inside() UNION ALL SELECT x + 1 FROM c "
            "WHERE x < 300000) SELECT COUNT(*), group_concat(hex(randomblob(8)), '') FROM c",
            (),
        )[0][0])

reader = threading.Thread(target=read)
reader.start()
inside.wait()  # the statement is running in the other thread
db.close()
print("closed after the read:", found)
reader.join()
"""


def test_closing_waits_for_a_statement_running_in_another_thread(tmp_path: Path) -> None:
    for n in range(3):
        done = subprocess.run(
            [sys.executable, "-c", SCRIPT, str(tmp_path / f"c{n}.db")],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip() == "closed after the read: [300000]", done.stderr
