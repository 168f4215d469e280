"""desktop.store.history: conversations, branches, search, concurrent use, full disks and kills."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from support import REPO

from desktop.config import paths
from desktop.engine.messages import PYTHON, PYTHON_OUTPUT, TEXT, Message, Part
from desktop.store import HistoryError, HistoryStore, StreamingWriter, schema
from desktop.store.export import from_json, to_json
from desktop.store.search import MARK_END, MARK_START

REPO = REPO


class Clock:
    """Wall time the test moves by hand, so ordering and purge ages are exact."""

    def __init__(self, start: float = 1_000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        self.now += 1.0  # every call is a distinct, later moment
        return self.now


@pytest.fixture(autouse=True)
def home(tmp_path: Path) -> Iterator[Path]:
    paths.set_home(tmp_path)
    yield tmp_path
    paths.set_home(None)


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def store(clock: Clock) -> Iterator[HistoryStore]:
    s = HistoryStore(clock=clock)
    yield s
    s.close()


def user(text: str) -> Message:
    return Message.of_text("user", text)


def reply(text: str, **meta: object) -> Message:
    return Message("assistant", [Part(TEXT, text)], dict(meta))


def texts(store: HistoryStore, conv: int) -> list[str]:
    return [m.plain_text() for _, m in store.active_path(conv)]


def integrity(path: Path) -> str:
    """SQLite's own check, plus FTS5's check that the search index matches the text it indexes."""
    conn = sqlite3.connect(path)
    try:
        result = str(conn.execute("PRAGMA integrity_check").fetchone()[0])
        for table in ("messages_fts", "titles_fts"):
            # rank = 1: compare the index with the content tables it was built from; raises if they differ
            conn.execute(f"INSERT INTO {table} ({table}, rank) VALUES ('integrity-check', 1)")
        return result
    finally:
        conn.close()


# ----- conversations ---------------------------------------------------------------------------


def test_default_location_and_schema_version(store: HistoryStore, home: Path) -> None:
    assert store.path == home / "data" / "history.sqlite3"
    conn = sqlite3.connect(store.path)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == len(schema.MIGRATIONS)
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    conn.close()


def test_list_is_newest_first_with_counts(store: HistoryStore) -> None:
    a = store.create_conversation("first")
    b = store.create_conversation("second", kind="compare", meta={"checkpoints": ["d20", "d26"]})
    store.add_message(a, user("hi"))  # a becomes the most recently updated
    rows = store.list_conversations()
    assert [(r.id, r.title, r.kind, r.message_count) for r in rows] == [
        (a, "first", "chat", 1),
        (b, "second", "compare", 0),
    ]
    assert store.conversation_meta(b) == {"checkpoints": ["d20", "d26"]}
    assert [r.id for r in store.list_conversations(limit=1, offset=1)] == [b]


def test_unknown_kind_is_refused(store: HistoryStore) -> None:
    with pytest.raises(ValueError, match="kind"):
        store.create_conversation("x", kind="debate")


def test_rename_delete_undelete_purge(store: HistoryStore, clock: Clock) -> None:
    keep = store.create_conversation("keep")
    gone = store.create_conversation("gone")
    store.add_message(gone, user("bye"))
    store.rename(keep, "kept")
    store.delete(gone)
    assert [r.title for r in store.list_conversations()] == ["kept"]
    assert {r.title for r in store.list_conversations(include_deleted=True)} == {"kept", "gone"}
    store.undelete(gone)
    assert len(store.list_conversations()) == 2

    store.delete(gone)
    assert store.purge_deleted(older_than_s=3600) == 0  # deleted just now: still in the trash
    clock.now += 7200
    assert store.purge_deleted(older_than_s=3600) == 1
    assert [r.title for r in store.list_conversations(include_deleted=True)] == ["kept"]
    conn = sqlite3.connect(store.path)
    assert conn.execute("SELECT COUNT(*) FROM messages").fetchone()[0] == 0  # cascaded
    conn.close()
    assert store.search("bye") == [] and store.search("gone") == []
    assert integrity(store.path) == "ok"


def test_writes_to_unknown_rows_fail_loudly(store: HistoryStore) -> None:
    # Caller mistakes are not disk trouble: they raise instead of waiting in the queue.
    with pytest.raises(ValueError, match="no conversation"):
        store.rename(12345, "x")
    with pytest.raises(sqlite3.IntegrityError):
        store.add_message(12345, user("x"))
    assert store.pending_count == 0


# ----- messages and branches -------------------------------------------------------------------


def test_message_parts_and_meta_round_trip(store: HistoryStore) -> None:
    conv = store.create_conversation("calc")
    u = store.add_message(conv, user("what is 6*7?"))
    answer = Message(
        "assistant",
        [Part(TEXT, "Let me compute "), Part(PYTHON, "6*7"), Part(PYTHON_OUTPUT, "42"), Part(TEXT, " → 42")],
        {
            "checkpoint": "/c/d20",
            "step": 650,
            "seed": 7,
            "sampling": {"temperature": 0.8},
            "path": Path("/x"),
        },
    )
    a = store.add_message(conv, answer, parent_id=u)
    path = store.active_path(conv)
    assert [mid for mid, _ in path] == [u, a]
    stored = path[1][1]
    assert stored.parts == answer.parts
    assert stored.meta == {**answer.meta, "path": str(Path("/x"))}  # not JSON: stored as text


def test_regeneration_makes_a_sibling_and_becomes_active(store: HistoryStore) -> None:
    conv = store.create_conversation("branches")
    u = store.add_message(conv, user("tell me a joke"))
    a1 = store.add_message(conv, reply("joke one"), u)
    store.add_message(conv, user("another"), a1)
    a2 = store.add_message(conv, reply("joke two"), u)  # regenerate the first answer
    assert texts(store, conv) == ["tell me a joke", "joke two"]
    assert store.siblings(a1) == [a1, a2]
    assert store.siblings(a2) == [a1, a2]
    assert store.siblings(u) == [u]


def test_select_branch_brings_back_the_old_branch_with_its_children(store: HistoryStore) -> None:
    conv = store.create_conversation("branches")
    u = store.add_message(conv, user("q"))
    a1 = store.add_message(conv, reply("a1"), u)
    f1 = store.add_message(conv, user("follow-up on a1"), a1)
    store.add_message(conv, reply("answer on a1"), f1)
    a2 = store.add_message(conv, reply("a2"), u)
    store.add_message(conv, user("follow-up on a2"), a2)

    store.select_branch(a1)
    assert texts(store, conv) == ["q", "a1", "follow-up on a1", "answer on a1"]
    store.select_branch(a2)
    assert texts(store, conv) == ["q", "a2", "follow-up on a2"]
    # Editing the first prompt makes a new root; the old conversation stays one click away.
    edited = store.add_message(conv, user("q, edited"))
    assert texts(store, conv) == ["q, edited"]
    assert store.siblings(edited) == [u, edited]
    store.select_branch(f1)
    assert texts(store, conv) == ["q", "a1", "follow-up on a1", "answer on a1"]


def test_an_exported_conversation_imports_as_it_was(store: HistoryStore) -> None:
    conv = store.create_conversation("original", meta={"note": "n"})
    parent = None
    for m in [user("q"), reply("a", seed=1), user("q2"), reply("a2", seed=2)]:
        parent = store.add_message(conv, m, parent)
    exported = from_json(
        to_json("original", [m for _, m in store.active_path(conv)], store.conversation_meta(conv))
    )
    copy = store.import_conversation("copy", exported.messages, meta=exported.meta)
    assert [m for _, m in store.active_path(copy)] == exported.messages
    assert store.conversation_meta(copy) == {"note": "n"}
    assert store.list_conversations()[0].message_count == 4
    assert [h.conversation_id for h in store.search("a2")] == [copy, conv]


def test_parent_must_be_in_the_same_conversation(store: HistoryStore) -> None:
    a = store.create_conversation("a")
    b = store.create_conversation("b")
    m = store.add_message(a, user("in a"))
    with pytest.raises(ValueError, match="not in conversation"):
        store.add_message(b, reply("in b"), parent_id=m)


def test_update_message_and_complete_flag(store: HistoryStore) -> None:
    conv = store.create_conversation("stream")
    u = store.add_message(conv, user("go"))
    a = store.add_message(conv, reply(""), u, complete=False)
    assert store.is_complete(u) and not store.is_complete(a)
    store.update_message(a, reply("done", tokens_per_s=50.0), complete=True)
    assert store.is_complete(a)
    assert store.active_path(conv)[-1][1] == reply("done", tokens_per_s=50.0)


def test_streaming_writer_writes_at_most_once_per_interval(store: HistoryStore) -> None:
    now = [0.0]
    conv = store.create_conversation("stream")
    u = store.add_message(conv, user("count"))
    msg = reply("")
    writer = StreamingWriter(store, store.add_message(conv, msg, u, complete=False), clock=lambda: now[0])
    # (arrival time, token, whether update() writes): at most one write per second of stream.
    steps = [(0.4, "one ", False), (0.8, "two ", False), (1.2, "three ", True), (1.6, "four ", False)]
    steps += [(2.0, "five ", False), (2.2, "six ", True), (2.6, "seven", False)]
    saved = ""
    for t, token, writes in steps:
        now[0] = t
        msg.append(TEXT, token)
        assert writer.update(msg) is writes
        saved = msg.plain_text() if writes else saved
        assert texts(store, conv)[-1] == saved
    writer.flush()
    assert texts(store, conv)[-1] == "one two three four five six seven"
    assert not store.is_complete(writer.msg_id)
    writer.finish(msg)
    assert store.is_complete(writer.msg_id)


# ----- search ----------------------------------------------------------------------------------


@pytest.fixture(params=["fts5", "like"])
def search_store(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[HistoryStore]:
    if request.param == "like":
        monkeypatch.setattr(schema, "fts5_available", lambda conn: False)
    s = HistoryStore(clock=Clock())
    assert s.full_text_search is (request.param == "fts5")
    yield s
    s.close()


def fill(store: HistoryStore) -> dict[str, int]:
    ids = {}
    for title, messages in [
        ("Gradient descent notes", ["how does the learning rate matter", "it scales each step"]),
        ("Tokenizer questions", ["what is BPE", "byte pair encoding merges frequent pairs"]),
        ("Shopping list", ["eggs, milk, bread", "noted: eggs milk bread"]),
        ("Another learning chat", ["the learning rate again", "lower it when the loss is noisy"]),
    ]:
        conv = ids[title] = store.create_conversation(title)
        parent = None
        for i, text in enumerate(messages):
            parent = store.add_message(conv, user(text) if i % 2 == 0 else reply(text), parent)
    return ids


def test_search_finds_titles_first_then_newest_messages(search_store: HistoryStore) -> None:
    ids = fill(search_store)
    hits = search_store.search("learning")
    # Title match first, then message matches newest first, one hit per conversation.
    assert [h.conversation_id for h in hits] == [ids["Another learning chat"], ids["Gradient descent notes"]]
    assert hits[0].message_id is None
    assert f"{MARK_START}learning{MARK_END}" in hits[0].snippet
    assert hits[1].message_id is not None
    assert f"{MARK_START}learning{MARK_END}" in hits[1].snippet


def test_search_needs_every_word_and_treats_the_last_as_a_prefix(search_store: HistoryStore) -> None:
    ids = fill(search_store)
    assert [h.conversation_id for h in search_store.search("learning noisy")] == []
    assert [h.conversation_id for h in search_store.search("loss noi")] == [ids["Another learning chat"]]
    hit = search_store.search("byte enc")[0]
    assert hit.conversation_id == ids["Tokenizer questions"]
    assert f"{MARK_START}encoding{MARK_END}" in hit.snippet
    assert search_store.search("milk")[0].conversation_id == ids["Shopping list"]
    assert search_store.search("MILK")[0].conversation_id == ids["Shopping list"]


def test_search_skips_deleted_and_honours_limit(search_store: HistoryStore) -> None:
    ids = fill(search_store)
    search_store.delete(ids["Shopping list"])
    assert search_store.search("eggs") == []
    assert len(search_store.search("the", limit=1)) == 1
    search_store.undelete(ids["Shopping list"])
    assert [h.conversation_id for h in search_store.search("eggs")] == [ids["Shopping list"]]


@pytest.mark.parametrize("query", ['"', 'NEAR("a" "b")', "AND OR NOT", "*", "a%_\\b", "   ", 'ünïcödé "x'])
def test_search_accepts_any_typed_text(search_store: HistoryStore, query: str) -> None:
    fill(search_store)
    assert isinstance(search_store.search(query), list)


def test_search_index_follows_updates_and_renames(store: HistoryStore) -> None:
    conv = store.create_conversation("old title")
    a = store.add_message(conv, reply("draft"), complete=False)
    store.update_message(a, reply("final words"), complete=True)
    store.rename(conv, "fresh title")
    assert store.search("draft") == [] and store.search("old") == []
    assert [h.conversation_id for h in store.search("final")] == [conv]
    assert [h.conversation_id for h in store.search("fresh")] == [conv]


def test_index_is_rebuilt_after_a_session_without_fts5(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    db = tmp_path / "h.db"
    with HistoryStore(db) as s:
        s.create_conversation("alpha")
    with monkeypatch.context() as m:
        m.setattr(schema, "fts5_available", lambda conn: False)
        with HistoryStore(db) as s:  # writes must work although the index cannot be kept current
            s.add_message(s.create_conversation("beta"), user("written without the index"))
    with HistoryStore(db) as s:
        assert s.full_text_search
        assert [h.title for h in s.search("beta")] == ["beta"]
        assert [h.title for h in s.search("index")] == ["beta"]
    assert integrity(db) == "ok"


# ----- opening -----------------------------------------------------------------------------------


def test_a_newer_database_is_refused(tmp_path: Path) -> None:
    db = tmp_path / "h.db"
    HistoryStore(db).close()
    conn = sqlite3.connect(db)
    conn.execute(f"PRAGMA user_version = {schema.SCHEMA_VERSION + 1}")
    conn.close()
    with pytest.raises(HistoryError, match="newer") as err:
        HistoryStore(db)
    assert str(db) in str(err.value) and "\n" not in str(err.value)


def test_a_file_that_is_not_a_database_is_refused_untouched(tmp_path: Path) -> None:
    db = tmp_path / "h.db"
    db.write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(HistoryError) as err:
        HistoryStore(db)
    assert str(err.value) == (
        f"{db}: not a SQLite database; Nanoscope leaves it alone (move it or choose another home)"
    )
    assert db.read_bytes() == b"this is not sqlite" * 100


def test_another_programs_database_is_refused_before_anything_changes_it(tmp_path: Path) -> None:
    db = tmp_path / "places.sqlite"
    conn = sqlite3.connect(db)
    conn.execute("CREATE TABLE moz_places (id INTEGER PRIMARY KEY, url TEXT)")
    conn.execute("INSERT INTO moz_places (url) VALUES ('https://example.org')")
    conn.commit()
    conn.close()
    before = db.read_bytes()
    with pytest.raises(HistoryError) as err:
        HistoryStore(db)
    assert str(err.value) == (
        f"{db}: a SQLite database of another program (schema version 0, tables: moz_places); "
        "Nanoscope leaves it alone (move it or choose another home)"
    )
    assert db.read_bytes() == before  # still in rollback-journal mode: the header is unchanged
    assert sorted(p.name for p in tmp_path.iterdir()) == ["places.sqlite"]


@pytest.mark.parametrize(
    ("parts", "meta", "shown", "problem"),
    [
        (
            '[{"kind": "text", "text": "hello"}, {"kind": "text"}]',
            "{}",
            ["hello"],
            "a part is not a {kind, text} object",
        ),
        ("[" * 100_000 + "]" * 100_000, "{}", [], "parts: nested deeper than 64 levels"),
        ("{not json", "{}", [], "parts: Expecting property name enclosed in double quotes at line 1"),
        (
            '[{"kind": "text", "text": "hi"}]',
            '{"tokens": ' + "[" * 5000 + "]" * 5000 + "}",
            ["hi"],
            "details: nested deeper than 64 levels",
        ),
        (
            '[{"kind": "text", "text": "hi"}]',
            '{"tokens": {"ids": "x"}}',
            ["hi"],
            "details: the stored token record is malformed",
        ),
    ],
    ids=["missing-text", "deep-parts", "malformed-parts", "deep-meta", "odd-trace"],
)
def test_a_malformed_row_opens_with_what_can_be_shown(tmp_path: Path, parts, meta, shown, problem) -> None:
    from desktop.store.message_rows import UNREADABLE

    store = HistoryStore(tmp_path / "h.db")
    conv = store.create_conversation("broken")
    first = store.add_message(conv, user("question"))
    store.add_message(conv, reply("answer"), first)
    with store._conn as conn:  # what a crash, a hand edit or another program may leave
        conn.execute("UPDATE messages SET parts = ?, meta = ? WHERE id != ?", (parts, meta, first))
    path = store.active_path(conv)
    assert path[0][1].plain_text() == "question"
    texts = [p.text for p in path[1][1].parts]
    assert texts[: len(shown)] == shown
    if problem is not None:
        assert texts[len(shown) :] == [UNREADABLE.format(problem)]
    store.close()


# ----- two instances ---------------------------------------------------------------------------


def test_two_stores_interleave_writes_on_one_file(tmp_path: Path) -> None:
    db = tmp_path / "h.db"
    first, second = HistoryStore(db), HistoryStore(db)
    conv = first.create_conversation("shared")
    parent = None
    for i in range(40):
        writer = first if i % 2 == 0 else second
        parent = writer.add_message(conv, user(f"turn {i}") if i % 2 == 0 else reply(f"turn {i}"), parent)
    mine = second.create_conversation("second's")
    second.add_message(mine, user("hello"))
    first.rename(mine, "renamed by first")
    assert texts(second, conv) == [f"turn {i}" for i in range(40)]
    assert {r.title: r.message_count for r in first.list_conversations()} == {
        "shared": 40,
        "renamed by first": 1,
    }
    first.close()
    second.close()
    assert integrity(db) == "ok"


def test_two_stores_writing_at_once_from_threads(tmp_path: Path) -> None:
    db = tmp_path / "h.db"
    HistoryStore(db).close()  # create the schema once, then race
    errors: list[BaseException] = []
    start = threading.Barrier(2)

    def work(name: str) -> None:
        try:
            with HistoryStore(db) as s:
                start.wait()
                for i in range(30):
                    conv = s.create_conversation(f"{name} {i}")
                    s.add_message(conv, user(f"{name} says {i}"))
                    assert s.pending_count == 0, s.last_error
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=work, args=(n,)) for n in ("left", "right")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    with HistoryStore(db) as s:
        rows = s.list_conversations(limit=100)
        assert len(rows) == 60 and all(r.message_count == 1 for r in rows)
    assert integrity(db) == "ok"


# ----- failed writes ---------------------------------------------------------------------------


def set_max_pages(store: HistoryStore, pages: int | None) -> None:
    """Simulate a full disk: SQLite refuses to grow the file past ``pages`` (None: no limit)."""
    conn = store._conn  # the store's own connection: the limit is per connection
    if pages is None:
        conn.execute("PRAGMA max_page_count = 2147483646")
    else:
        conn.execute(f"PRAGMA max_page_count = {pages}")


def page_count(store: HistoryStore) -> int:
    return int(store._conn.execute("PRAGMA page_count").fetchone()[0])


def test_full_disk_keeps_writes_in_memory_until_space_returns(store: HistoryStore) -> None:
    conv = store.create_conversation("big")
    u = store.add_message(conv, user("write a long answer"))
    set_max_pages(store, page_count(store))

    big = reply("x" * 200_000)
    a = store.add_message(conv, big, u, complete=False)  # does not raise
    assert a < 0  # a placeholder id: the row does not exist yet
    assert store.pending_count == 1
    assert store.last_error is not None and "full" in store.last_error and "\n" not in store.last_error
    # Later writes queue behind it, in order, and may use the placeholder id.
    store.update_message(a, reply("y" * 200_000), complete=False)
    store.update_message(a, reply("z" * 200_000, seed=3), complete=True)  # replaces the previous update
    store.rename(conv, "big, renamed")
    assert store.pending_count == 3
    assert store.retry_pending() is False
    assert texts(store, conv) == ["write a long answer"]  # the database is as it was

    set_max_pages(store, None)
    assert store.retry_pending() is True
    assert store.pending_count == 0 and store.last_error is None
    (_, _), (real_id, answer) = store.active_path(conv)
    assert real_id > 0 and answer == reply("z" * 200_000, seed=3)
    assert store.is_complete(real_id)
    store.update_message(a, reply("placeholder ids keep working"), complete=True)
    assert texts(store, conv)[-1] == "placeholder ids keep working"
    assert store.list_conversations()[0].title == "big, renamed"
    assert integrity(store.path) == "ok"


def test_the_next_write_retries_the_queue_first(store: HistoryStore) -> None:
    conv = store.create_conversation("c")
    set_max_pages(store, page_count(store))
    first = store.add_message(conv, user("x" * 100_000))
    assert store.pending_count == 1
    set_max_pages(store, None)
    store.add_message(conv, reply("next"), first)  # replays the queued message first, then this one
    assert store.pending_count == 0
    assert [len(t) for t in texts(store, conv)] == [100_000, 4]


# ----- killed mid-stream -----------------------------------------------------------------------

CHILD = r"""
import sys
from desktop.engine.messages import Message, TEXT
from desktop.store import HistoryStore, StreamingWriter

ticks = iter(range(10**9))  # a clock that advances one unit per call: writes every few tokens
store = HistoryStore(sys.argv[1])
conv = store.create_conversation("crash test")
u = store.add_message(conv, Message.of_text("user", "stream forever"))
reply = Message("assistant")
writer = StreamingWriter(store, store.add_message(conv, reply, u, complete=False),
                         interval_s=4, clock=lambda: next(ticks))
reported = False
for i in range(10**6):
    reply.append(TEXT, f"t{i} ")
    if writer.update(reply) and i >= 300 and not reported:
        print("FLUSHED", reply.plain_text(), flush=True)
        reported = True  # and keep streaming, so the kill lands mid-write or between writes
"""


def test_killed_while_streaming_keeps_everything_up_to_the_last_flush(tmp_path: Path) -> None:
    db = tmp_path / "h.db"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(db)], stdout=subprocess.PIPE, env=env, cwd=REPO, text=True
    )
    try:
        assert child.stdout is not None
        line = child.stdout.readline()  # blocks until the child reports a flush; no sleeping
        child.send_signal(signal.SIGKILL)
    finally:
        child.kill()
        child.wait()
        if child.stdout is not None:
            child.stdout.close()
    assert line.startswith("FLUSHED "), line
    flushed = line[len("FLUSHED ") :].rstrip("\n")
    assert child.returncode == -signal.SIGKILL
    assert integrity(db) == "ok"
    with HistoryStore(db) as s:
        (conv,) = s.list_conversations()
        (_, question), (reply_id, answer) = s.active_path(conv.id)
        assert not s.is_complete(reply_id)
    text = answer.plain_text()
    assert question.plain_text() == "stream forever"
    assert text.startswith(flushed)  # nothing written before the report was lost
    assert text == "".join(f"t{i} " for i in range(text.count(" ")))  # and no torn write


# ----- schema migrations ----------------------------------------------------------------------


def test_a_version_1_database_moves_its_tokens_to_the_one_encoding(tmp_path: Path) -> None:
    """Chats of schema 1 kept [id, forced] pairs under "raw"; comparisons one list per field."""
    path = tmp_path / "old.sqlite3"
    conn = sqlite3.connect(path)
    for statement in schema.MIGRATIONS[0]:
        conn.execute(statement)
    conn.execute("PRAGMA user_version = 1")
    conn.execute("INSERT INTO conversations (id, title, created, updated) VALUES (1, 'chat', 1, 1)")
    conn.execute(
        "INSERT INTO conversations (id, title, kind, created, updated) VALUES (2, 'cmp', 'compare', 1, 1)"
    )
    text = '[{"kind": "text", "text": "hi"}]'
    rows = [
        (1, 1, None, "user", "{}"),
        (2, 1, 1, "assistant", '{"raw": [[5, false], [7, true]], "step": 3}'),
        (3, 2, None, "user", "{}"),
        (
            4,
            2,
            3,
            "assistant",
            '{"pane": "A", "seed": 9, "sampling": {"temperature": 1.0}, "token_ids": [5, 6],'
            ' "token_texts": ["h", "i"], "token_kinds": ["text", "text"], "token_specials": [null, null],'
            ' "token_forced": [false, false], "token_logprobs": [-0.5, -1.5],'
            ' "top_logprobs": [[[5, "h", -0.5]], [[6, "i", -1.5]]]}',
        ),
        (5, 2, 3, "assistant", '{"pane": "B", "not json'),
    ]
    for msg_id, conv, parent, role, meta in rows:
        conn.execute(
            "INSERT INTO messages (id, conversation_id, parent_id, role, parts, meta, created, rank)"
            " VALUES (?, ?, ?, ?, ?, ?, 1, ?)",
            (msg_id, conv, parent, role, text, meta, msg_id),
        )
    conn.commit()
    conn.close()

    with HistoryStore(path) as store:
        chat = store.active_path(1)[1][1]
        assert chat.tokens.ids == [5, 7] and chat.tokens.forced == [False, True]
        assert "raw" not in chat.meta and chat.meta["step"] == 3
        conn = sqlite3.connect(path)
        metas = dict(conn.execute("SELECT id, meta FROM messages").fetchall())
        conn.close()
        assert metas[5] == '{"pane": "B", "not json'  # unreadable rows are left as they were
        compare = Message.restore("assistant", [], json.loads(metas[4]))
    assert compare.tokens.ids == [5, 6] and compare.tokens.texts == ["h", "i"]
    assert compare.tokens.logprobs == [(-0.5, [(5, "h", -0.5)]), (-1.5, [(6, "i", -1.5)])]
    assert compare.meta["sampling"] == {"temperature": 1.0, "seed": 9} and "token_ids" not in compare.meta


def test_a_reply_round_trips_its_token_trace(store: HistoryStore) -> None:
    from desktop.engine.messages import TokenEvent

    conv = store.create_conversation("t")
    reply = Message("assistant")
    for ev in (
        TokenEvent(3, "Hel", False, TEXT, logprob=-0.1, top=((3, "Hel", -0.1),)),
        TokenEvent(4, "", False, PYTHON, "<|python_start|>"),
        TokenEvent(-1, "lo", False, PYTHON, continues=True),
    ):
        reply.add_event(ev)
    msg = store.add_message(conv, reply)
    ((_, again),) = [(i, m) for i, m in store.active_path(conv) if i == msg]
    assert again.tokens == reply.tokens and again.parts == reply.parts
    assert again.tokens.texts == ["Hel", "lo"] and again.tokens.logprobs[1] is None


def test_an_unreadable_conversation_meta_reads_as_empty(tmp_path: Path) -> None:
    store = HistoryStore(tmp_path / "h.db")
    conv = store.create_conversation("c", meta={"model": "x"})
    with store._conn as conn:
        conn.execute("UPDATE conversations SET meta = ?", ("[" * 10_000 + "]" * 10_000,))
    assert store.conversation_meta(conv) == {}
    store.close()
