"""The names index: which titles a name may stand for, kept in store.sqlite beside the documents (table `names`), so
that a question's subject is found in its text (`query.linking`).

Each row says that a normalised name (`text.normalize_title`) names a normalised title, and how: TITLE (it is the
title), ALIAS (one of its documents' aliases or redirects) or PART (a part of the title by which it may be named
alone: its last word, a person's surname; its first word, a company's; its words before a parenthesis, "Mercury" of
"Mercury (planet)"). A PART names a title only where it names no other live title: a lookup reads at most two of a
name's parts that have a live document (`lookup`), however common the name ("John"), so that a name a removed
document shared is a part of one title again: removing what was added gives every link back (an undone edit leaves
no trace). Rows are keyed by title, not document: an article and its updates share theirs. Every row stays until a
rebuild (which leaves out the parts of titles whose documents are all removed, `forget`) and is read only where its
title has a live document: live in the commit the reader holds (`lookup`'s `held`), so a reader links as that commit
did until it is reopened. A Wikipedia dump's redirects are aliases
of their targets (kept in the table `redirects`, since a redirect names a title, not a document). A writer adds a
document's rows in the transaction that registers it; a store made before the index, or before its FORM, gets it
whole from its next writer (`ensure`), and `bertknn repair` rebuilds it (`rebuild`).
"""

from __future__ import annotations

import json
import re
import sqlite3
from collections.abc import Iterable

from bertknn.text import normalize_title, stopwords

TITLE, ALIAS, PART = 0, 1, 2  # how a name names a title (lower: stronger)
KINDS = {TITLE: "title", ALIAS: "alias", PART: "part of the title"}
MORE = ""  # the title `lookup` gives a PART that names more than one live title (an index made before: its row)
MIN_PART = 3  # the shortest part of a title kept, in characters
META = "names"  # the meta row that says the index covers every document, and its form (FORM)
FORM = "2"  # a PART row per title whose documents are not all removed (1: at most two, then a MORE row)
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
        _named(db, name, norm, kind)


def forget(db: sqlite3.Connection, titles: Iterable[str]) -> None:
    """Drop the PART rows of those normalised `titles` that no document names any more but removed ones (after
    their removal, in the caller's transaction)."""
    db.execute(
        "DELETE FROM names WHERE kind = ? AND title IN (SELECT value FROM json_each(?)) AND NOT EXISTS "
        "(SELECT 1 FROM documents d WHERE d.norm_title = names.title AND d.state != 'removed')",
        (PART, json.dumps(sorted(set(titles)))),
    )


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
    only where its title has a live document; but the parts of titles whose documents are all removed, `forget`), in
    the caller's transaction; return the rows written."""
    db.execute("DELETE FROM names")
    rows = db.execute("SELECT title, norm_title, aliases FROM documents ORDER BY idx").fetchall()
    for title, _, aliases in rows:
        add(db, title, json.loads(aliases) if aliases else ())
    for name, title in db.execute("SELECT name, title FROM redirects ORDER BY name, title").fetchall():
        _named(db, name, title, ALIAS)
    forget(db, [norm for _, norm, _ in rows])
    db.execute("INSERT INTO meta VALUES (?, ?) ON CONFLICT (key) DO UPDATE SET value = ?", (META, FORM, FORM))
    return db.execute("SELECT count(*) FROM names").fetchone()[0]


def ensure(db: sqlite3.Connection) -> None:
    """Give a store made before the names index, or before its FORM, its index (a writer's first step), in one
    transaction."""
    if db.execute("SELECT 1 FROM meta WHERE key = ? AND value = ?", (META, FORM)).fetchone() is None:
        with db:
            rebuild(db)


def indexed(db: sqlite3.Connection) -> bool:
    """Whether the store has its names index (a store made before it has none until its next writer)."""
    try:
        return db.execute("SELECT 1 FROM meta WHERE key = ?", (META,)).fetchone() is not None
    except sqlite3.OperationalError:  # no meta table: an empty store
        return False


def lookup(
    db: sqlite3.Connection, spans: list[str], held: tuple[int, list[int]] | None = None
) -> list[tuple[str, str, int, str]] | None:
    """(name, normalised title, kind, a live document's title as written) of the names among `spans` whose title has
    a live document, one query: each title or alias, and each part of a title that names one live title alone (a part
    that names several: one row of the title MORE, written ""); None where the store has no names index (made before
    it: its next writer gives it one). A part's first two live titles are read, however many titles share it. `held`
    (a reader's commit: its documents' count and those hidden then): live is live in that commit; else, now."""
    spanned, (count, hidden) = json.dumps(spans), held or (None, [])
    params = {"spans": spanned, "part": PART, "count": count, "hidden": json.dumps(hidden)}
    try:
        return db.execute(LOOKUP_HELD if held else LOOKUP, params).fetchall()
    except sqlite3.OperationalError as err:
        if "no such table" in str(err):
            return None
        raise


NOW = "+d.state = 'live'"  # live in the latest commit
HELD = "d.idx < :count AND d.idx NOT IN (SELECT value FROM json_each(:hidden))"  # live in the commit a reader holds


def _lookup(live: str) -> str:
    """The names lookup's one query, a document live as `live` says (NOW or HELD)."""
    first = f"(SELECT d.title FROM documents d WHERE d.norm_title = {{}} AND {live} LIMIT 1)"  # by the title's index
    parts = (  # a span's first two part titles with a live document (or an index made before FORM 2's MORE row)
        "(SELECT q.title FROM names q WHERE q.name = j.value AND q.kind = 2 AND (q.title = '' OR "
        + first.format("q.title").replace("SELECT d.title", "SELECT 1")
        + ") ORDER BY q.title LIMIT 1 OFFSET {})"
    )
    return (  # each span's two part titles read once (MATERIALIZED), then the titles and aliases, then the parts
        f"WITH p AS MATERIALIZED (SELECT j.value AS name, {parts.format(0)} AS one, {parts.format(1)} AS two FROM "
        "json_each(:spans) j), q AS MATERIALIZED (SELECT name, CASE WHEN two IS NOT NULL OR one = '' THEN '' ELSE "
        "one END AS title FROM p WHERE one IS NOT NULL) "
        f"SELECT name, title, kind, shown FROM (SELECT n.name, n.title, n.kind, {first.format('n.title')} AS shown "
        "FROM json_each(:spans) j JOIN names n ON n.name = j.value AND n.kind < :part) WHERE shown IS NOT NULL "
        f"UNION ALL SELECT r.name, r.title, 2, CASE WHEN r.title = '' THEN '' ELSE {first.format('r.title')} END "
        "FROM q r"
    )


LOOKUP, LOOKUP_HELD = _lookup(NOW), _lookup(HELD)


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
