"""The names index: which titles a name may stand for, kept in store.sqlite beside the documents (table `names`), so
that a question's subject is found in its text (`query.linking`).

Each row says that a normalised name (`text.normalize_title`) names a normalised title, and how: TITLE (it is the
title), ALIAS (one of its documents' aliases or redirects) or PART (a part of the title by which it may be named
alone: its last word, a person's surname; its first word, a company's; its words before a parenthesis, "Mercury" of
"Mercury (planet)"). A PART names a title only where it names no other: a name that is a
part of more than MAX_PARTS titles keeps MAX_PARTS rows and one row of the title MORE, so that its rows stay few
however common the name ("John") and a removal never makes it look unambiguous. Rows are keyed by title, not
document: an article and its updates share theirs, and a removed document's rows stay until a rebuild, read only
where the title has a live document. A Wikipedia dump's redirects are aliases of their targets (kept in the table
`redirects`, since a redirect names a title, not a document). A writer adds a document's rows in the transaction that
registers it; a store
made before the index gets it whole from its next writer (`ensure`), and `bertknn repair` rebuilds it (`rebuild`).
"""

from __future__ import annotations

import json
import re
import sqlite3
from collections.abc import Iterable

from bertknn.text import normalize_title, stopwords

TITLE, ALIAS, PART = 0, 1, 2  # how a name names a title (lower: stronger)
KINDS = {TITLE: "title", ALIAS: "alias", PART: "part of the title"}
MORE = ""  # the title of the row that says a PART names more titles than its rows list
MAX_PARTS = 2  # PART rows kept per name: enough to see that it is ambiguous
MIN_PART = 3  # the shortest part of a title kept, in characters
META = "names"  # the meta row that says the index covers every document
NAMES_PROBLEM = "store.sqlite: the names index lacks the titles of {} live document(s); `bertknn repair` rebuilds it"
PAREN = re.compile(r"\s*\([^()]*\)\s*$")  # a Wikipedia title's disambiguation: "Mercury (planet)"


def names_of(title: str, aliases: Iterable[str] = ()) -> list[tuple[str, int]]:
    """(name, kind) of each normalised name of a document titled `title` with `aliases`: the title, the aliases, and
    the parts of the title (its words before a parenthesis; of a title of several words, its last and its first word),
    a part that is a stopword or shorter than MIN_PART characters left out. The strongest kind of a name given twice."""
    found = {normalize_title(title): TITLE}
    for alias in aliases:
        found.setdefault(normalize_title(alias), ALIAS)
    base = PAREN.sub("", normalize_title(title))
    words = base.split()
    for part in [base, *([words[-1], words[0]] if len(words) > 1 else [])]:
        if len(part) >= MIN_PART and part not in stopwords() and not part.isdigit():
            found.setdefault(part, PART)
    return [(name, kind) for name, kind in found.items() if name]


def add(db: sqlite3.Connection, title: str, aliases: Iterable[str] = ()) -> None:
    """Record the names of a document (its title and aliases), in the caller's transaction."""
    norm = normalize_title(title)
    for name, kind in names_of(title, aliases):
        if kind != PART:
            _named(db, name, norm, kind)
            continue
        if db.execute("SELECT 1 FROM names WHERE name = ? AND title = ?", (name, norm)).fetchone():
            continue
        listed = db.execute("SELECT count(*) FROM names WHERE name = ? AND kind = ?", (name, PART)).fetchone()[0]
        db.execute("INSERT OR IGNORE INTO names VALUES (?, ?, ?)", (name, norm if listed < MAX_PARTS else MORE, PART))


def add_redirects(db: sqlite3.Connection, redirects: Iterable[tuple[str, str]]) -> None:
    """Record redirects ((redirect title, target title) pairs) as aliases of their targets, in the caller's
    transaction; kept in the `redirects` table too, for `rebuild`."""
    rows = [(normalize_title(name), normalize_title(title)) for name, title in redirects]
    db.executemany("INSERT OR IGNORE INTO redirects VALUES (?, ?)", rows)
    for name, title in rows:
        _named(db, name, title, ALIAS)


def _named(db: sqlite3.Connection, name: str, title: str, kind: int) -> None:
    """A row saying that `name` names `title` as `kind` says (where one is there, the stronger kind stays)."""
    db.execute(
        "INSERT INTO names VALUES (?, ?, ?) ON CONFLICT (name, title) DO UPDATE SET kind = min(kind, excluded.kind)",
        (name, title, kind),
    )


def rebuild(db: sqlite3.Connection) -> int:
    """The index made again from the documents' titles and aliases (every document's, removed ones too: a row is read
    only where its title has a live document), in the caller's transaction; return the rows written."""
    db.execute("DELETE FROM names")
    for title, aliases in db.execute("SELECT title, aliases FROM documents ORDER BY idx").fetchall():
        add(db, title, json.loads(aliases) if aliases else ())
    for name, title in db.execute("SELECT name, title FROM redirects ORDER BY name, title").fetchall():
        _named(db, name, title, ALIAS)
    db.execute("INSERT INTO meta VALUES (?, '1') ON CONFLICT (key) DO UPDATE SET value = '1'", (META,))
    return db.execute("SELECT count(*) FROM names").fetchone()[0]


def ensure(db: sqlite3.Connection) -> None:
    """Give a store made before the names index its index (a writer's first step), in one transaction."""
    if db.execute("SELECT 1 FROM meta WHERE key = ?", (META,)).fetchone() is None:
        with db:
            rebuild(db)


def indexed(db: sqlite3.Connection) -> bool:
    """Whether the store has its names index (a store made before it has none until its next writer)."""
    try:
        return db.execute("SELECT 1 FROM meta WHERE key = ?", (META,)).fetchone() is not None
    except sqlite3.OperationalError:  # no meta table: an empty store
        return False


def lookup(db: sqlite3.Connection, spans: list[str]) -> list[tuple[str, str, int, str]] | None:
    """(name, normalised title, kind, a live document's title as written) of the names among `spans` whose title has
    a live document (and the MORE rows of ambiguous parts, their title as written ""), one query; None where the store
    has no names index (made before it: its next writer gives it one)."""
    try:
        return db.execute(
            "SELECT name, title, kind, shown FROM (SELECT n.name, n.title, n.kind, CASE WHEN n.title = '' THEN '' ELSE "
            "(SELECT d.title FROM documents d WHERE d.norm_title = n.title AND +d.state = 'live' LIMIT 1) END AS shown "
            "FROM json_each(?) j JOIN names n ON n.name = j.value) WHERE shown IS NOT NULL",  # by the title's index
            (json.dumps(spans),),
        ).fetchall()
    except sqlite3.OperationalError as err:
        if "no such table" in str(err):
            return None
        raise


def aliases_of(db: sqlite3.Connection, title: str) -> list[str]:
    """The names (title and aliases, not parts) of a normalised title (the title alone without a names index)."""
    try:
        rows = db.execute("SELECT name FROM names WHERE title = ? AND kind < ?", (title, PART)).fetchall()
    except sqlite3.OperationalError as err:
        if "no such table" in str(err):
            return [title]
        raise
    return [r[0] for r in rows] or [title]


def problems(db: sqlite3.Connection) -> list[str]:
    """What is wrong with the names index (`bertknn verify`): live documents whose title it lacks."""
    if not indexed(db):
        return []
    lacking = db.execute(
        "SELECT count(*) FROM documents d WHERE d.state = 'live' AND NOT EXISTS (SELECT 1 FROM names n WHERE "
        "n.name = d.norm_title AND n.title = d.norm_title)"
    ).fetchone()[0]
    return [NAMES_PROBLEM.format(lacking)] if lacking else []
