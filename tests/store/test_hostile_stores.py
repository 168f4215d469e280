"""The app's SQLite stores against files rewritten by someone else: every statement has a deadline
and a row budget; a schema the app did not make (a view over an endless query where a table
belongs, a trigger inside every write) is never queried: the eval-results cache is set aside and
made again, the history is refused untouched. The valid controls are stores the app wrote."""

from __future__ import annotations

import logging
import sqlite3
import sys
from pathlib import Path

import pytest

from desktop.store import HistoryError, HistoryStore, guard
from desktop.store.eval_results import FILE_HASHES, FIRST_RESULTS, RESULTS, SCHEMA_VERSION, EvalResults

ENDLESS = "WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r)"
SLOW_BODY = f"BEGIN SELECT count(*) FROM ({ENDLESS} SELECT n FROM r); END"
KEY = ("/runs/d2", 60, "ab" * 32, "answers", "cd" * 32, "greedy 64")
ANSWERS = [{"stage": "sft", "step": 60, "correct": True}]


def write_db(path: Path, *statements: str) -> bytes:
    conn = sqlite3.connect(path)
    for statement in statements:
        conn.execute(statement)
    conn.commit()
    conn.close()
    return path.read_bytes()


def warnings_of(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


# ----- the guard ---------------------------------------------------------------------------------


def test_an_endless_query_stops_at_its_instruction_budget():
    conn = guard.connect(":memory:", steps=200_000, seconds=3600, max_value=1 << 20)
    with pytest.raises(sqlite3.OperationalError, match="interrupted"):
        conn.execute(f"{ENDLESS} SELECT count(*) FROM r").fetchone()
    assert conn.deadline.fired and conn.deadline.used <= 200_000 + guard.CHECK_EVERY
    assert conn.execute("SELECT 1").fetchone() == (1,)  # the next statement has its own budget
    assert not conn.deadline.fired


def test_rows_past_their_budget_are_refused_after_reading_no_more():
    conn = guard.connect(":memory:", steps=10**9, seconds=3600, max_value=1 << 20)
    read = []
    with pytest.raises(guard.Untrusted, match="more than 3 rows"):
        for row in guard.rows(conn, f"{ENDLESS} SELECT n FROM r", (), 3):
            read.append(row)
    assert read == [(1,), (2,), (3,)]


@pytest.mark.skipif(sys.version_info < (3, 11), reason="Connection.setlimit is Python 3.11+")
def test_a_value_past_its_budget_is_an_error_not_an_allocation(tmp_path):
    db = tmp_path / "big.db"
    write_db(db, "CREATE TABLE t (a)", "INSERT INTO t VALUES (zeroblob(5000))")
    conn = guard.connect(db, steps=10**9, seconds=3600, max_value=1000)
    with pytest.raises(sqlite3.DataError, match="too big"):
        conn.execute("SELECT a FROM t").fetchone()


def test_a_store_set_aside_takes_its_journal_along(tmp_path):
    db = tmp_path / "r.sqlite3"
    db.write_bytes(b"one")
    (tmp_path / "r.sqlite3-journal").write_bytes(b"two")
    (tmp_path / "r.sqlite3.unusable-1").write_bytes(b"an earlier one")
    aside = guard.set_aside(db)
    assert aside.name == "r.sqlite3.unusable-2" and aside.read_bytes() == b"one"
    assert (tmp_path / "r.sqlite3.unusable-2-journal").read_bytes() == b"two"
    assert not db.exists() and not (tmp_path / "r.sqlite3-journal").exists()


# ----- eval results: set aside and made again ---------------------------------------------------


def test_a_store_the_app_wrote_opens_as_it_is(tmp_path, caplog):
    db = tmp_path / "r.sqlite3"
    EvalResults(db).put(KEY, ANSWERS)
    with caplog.at_level(logging.INFO):
        assert EvalResults(db).get(KEY) == ANSWERS
    assert warnings_of(caplog) == [] and sorted(p.name for p in tmp_path.iterdir()) == ["r.sqlite3"]


HOSTILE = {
    "views over an endless query": (
        f"CREATE VIEW results AS {ENDLESS} SELECT n AS weights, n AS task, n AS data, n AS settings, "
        "n AS answers, n AS saved FROM r",
        f"CREATE VIEW file_hashes AS {ENDLESS} "
        "SELECT n AS path, n AS size, n AS mtime_ns, n AS sha256 FROM r",
    ),
    "a trigger inside every write": (
        FIRST_RESULTS,
        FILE_HASHES,
        f"CREATE TRIGGER slow AFTER INSERT ON file_hashes {SLOW_BODY}",
    ),
    "a table of another shape": ("CREATE TABLE results (weights TEXT, answers TEXT, x AS (zeroblob(1e9)))",),
    "another program's tables": ("CREATE TABLE moz_places (id INTEGER PRIMARY KEY)",),
    "our layout with a stranger": (
        RESULTS,
        FILE_HASHES,
        "CREATE INDEX odd ON file_hashes (zeroblob(1000000))",
        f"PRAGMA user_version = {SCHEMA_VERSION}",
    ),
}


@pytest.mark.parametrize("statements", list(HOSTILE.values()), ids=list(HOSTILE))
def test_a_store_the_app_did_not_make_is_set_aside_and_made_again(tmp_path, caplog, statements):
    db = tmp_path / "r.sqlite3"
    before = write_db(db, *statements)
    with caplog.at_level(logging.INFO):
        store = EvalResults(db)
        assert store.get(KEY) is None
        store.put(KEY, ANSWERS)
        assert store.get(KEY) == ANSWERS  # the fresh store keeps what it is given
    lines = warnings_of(caplog)
    assert len(lines) == 1 and "set aside as r.sqlite3.unusable-1" in lines[0] and "\n" not in lines[0]
    assert (tmp_path / "r.sqlite3.unusable-1").read_bytes() == before  # kept for the user, untouched
    assert store._deadline is not None and not store._deadline.fired  # nothing of it was run


@pytest.mark.parametrize("content", [b"not a database at all" * 100, b"SQLite format 3\x00" + bytes(200)])
def test_a_damaged_store_is_set_aside(tmp_path, caplog, content):
    db = tmp_path / "r.sqlite3"
    db.write_bytes(content)
    with caplog.at_level(logging.INFO):
        store = EvalResults(db)
        store.put(KEY, ANSWERS)
        assert store.get(KEY) == ANSWERS
    assert len(warnings_of(caplog)) == 1
    assert (tmp_path / "r.sqlite3.unusable-1").read_bytes() == content


def test_the_first_layout_keeps_its_hashes_and_drops_results_that_name_no_step(tmp_path, caplog):
    db = tmp_path / "r.sqlite3"
    write_db(
        db,
        FIRST_RESULTS,
        FILE_HASHES,
        "INSERT INTO file_hashes VALUES ('[\"model.pt\"]', 10, 20, 'feed')",
        "INSERT INTO results VALUES ('w', 'answers', 'd', 's', '[]', 0)",
    )
    with caplog.at_level(logging.INFO):
        store = EvalResults(db)
        assert store._query("SELECT sha256 FROM file_hashes", ()) == ("feed",)
        assert store._query("SELECT count(*) FROM results", ()) == (0,)
        assert store._query("PRAGMA user_version", ()) == (SCHEMA_VERSION,)
        store.put(KEY, ANSWERS)
        assert store.get(KEY) == ANSWERS
    assert warnings_of(caplog) == [] and sorted(p.name for p in tmp_path.iterdir()) == ["r.sqlite3"]


def test_a_store_of_a_newer_app_is_left_alone_and_not_used(tmp_path, caplog):
    db = tmp_path / "r.sqlite3"
    before = write_db(db, "CREATE TABLE results (x)", f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    with caplog.at_level(logging.INFO):
        store = EvalResults(db)
        store.put(KEY, ANSWERS)
        assert store.get(KEY) is None
    lines = warnings_of(caplog)
    assert len(lines) == 1 and "newer" in lines[0]
    assert db.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == ["r.sqlite3"]


# ----- history: refused untouched ---------------------------------------------------------------


@pytest.mark.parametrize(
    "statement",
    [
        f"CREATE VIEW recent AS {ENDLESS} SELECT n FROM r",
        f"CREATE TRIGGER slow AFTER INSERT ON messages {SLOW_BODY}",
        # an index whose every entry allocates, on the app's own table
        "CREATE INDEX odd ON messages (zeroblob(1000000))",
        # a trigger under the name of the app's own, with another body
        "CREATE TRIGGER messages_fts_ai AFTER INSERT ON messages BEGIN SELECT 1; END",
    ],
    ids=["view", "trigger", "index", "our-trigger-name"],
)
def test_a_history_holding_what_the_app_does_not_make_is_refused_untouched(tmp_path, statement):
    db = tmp_path / "h.db"
    with HistoryStore(db) as store:
        store.create_conversation("kept")
    conn = sqlite3.connect(db)
    conn.execute("DROP TRIGGER IF EXISTS messages_fts_ai")
    conn.execute(statement)
    conn.commit()
    conn.close()
    before = db.read_bytes()
    with pytest.raises(HistoryError) as err:
        HistoryStore(db)
    line = str(err.value)
    assert line.startswith(f"{db}: holds ") and "Nanoscope does not make" in line and "\n" not in line
    assert db.read_bytes() == before


def test_a_history_the_app_wrote_opens(tmp_path):
    db = tmp_path / "h.db"
    with HistoryStore(db) as store:
        store.create_conversation("kept")
    with HistoryStore(db) as store:  # closing ran PRAGMA optimize: SQLite's own statistics are fine
        assert [c.title for c in store.list_conversations()] == ["kept"]


def test_messages_whose_parents_loop_end_the_branch_walk(tmp_path):
    from desktop.engine.messages import Message

    with HistoryStore(tmp_path / "h.db") as store:
        conv = store.create_conversation("loop")
        first = store.add_message(conv, Message.of_text("user", "a"))
        second = store.add_message(conv, Message.of_text("assistant", "b"), first)
        with store._conn as conn:  # a hand edit: each the other's parent
            conn.execute("UPDATE messages SET parent_id = ? WHERE id = ?", (second, first))
        store.select_branch(second)
        assert store.pending_count == 0 and store.last_error is None


def test_a_history_whose_tables_are_views_is_another_programs(tmp_path):
    db = tmp_path / "h.db"
    before = write_db(
        db,
        f"CREATE VIEW conversations AS {ENDLESS} SELECT n AS id FROM r",
        f"CREATE VIEW messages AS {ENDLESS} SELECT n AS id FROM r",
    )
    with pytest.raises(HistoryError, match="another program") as err:
        HistoryStore(db)
    assert "tables: none" in str(err.value) and db.read_bytes() == before
