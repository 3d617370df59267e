"""Subject linking (`query.linking`): a question asked without a subject is given the one its text names, found among
the datastore's names index (`store.names`: titles, aliases, parts of titles), and searched as with that subject."""

import sqlite3

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bertknn.query.linking import link
from bertknn.query.pipeline import BertKNN
from bertknn.query.settings import PAPER
from bertknn.store.names import ALIAS, PART, TITLE, names_of
from bertknn.text import normalize_title, stopwords
from tests.conftest import writable, write_corpus
from tests.query.test_versions import KNN_ONLY

DOCS = [
    {"id": "a", "title": "Ilsa Varnhold", "text": "Ilsa Varnhold was born in Lisbon. She sang."},
    {"id": "b", "title": "Anna Berg", "text": "Anna Berg was born in Oslo."},
    {"id": "c", "title": "Tomas Berg", "text": "Tomas Berg was born in Bergen."},
    {"id": "d", "title": "Mercury (planet)", "text": "Mercury is the smallest planet."},
    {
        "id": "e",
        "title": "Dante Alighieri",
        "text": "Dante Alighieri was born in Florence.",
        "aliases": ["Durante degli Alighieri", "Sommo Poeta"],
    },
    {"id": "f", "title": "Port Elsmere", "text": "Port Elsmere is a town by the sea."},
    {"id": "g", "title": "Oudemeer Kessling", "text": "Oudemeer Kessling was born in Porto."},
]
POOL = ["Ilsa", "Varnhold", "Anna", "Berg", "Tomas", "Mercury", "Dante", "Alighieri", "Durante", "degli", "Sommo"]
POOL += ["Poeta", "Port", "Elsmere", "Oudemeer", "Kessling", "planet", "born", "town", "the", "was", "of", "in", "is"]


@pytest.fixture(scope="module")
def linked(tmp_path_factory, encoder):
    tmp = tmp_path_factory.mktemp("linking")
    return BertKNN.build(write_corpus(tmp / "c.jsonl", DOCS), tmp / "s", encoder)


def _named(part: list[str], plain: list[bool], at: int, beyond: int, first: bool) -> bool:
    """Whether the word at `at` beside a span continues a name: capitalised without opening the question (`first`:
    the part before the mask, whose first word opens it), or a connector ("of", "the") with a capitalised word that
    is no stopword and opens nothing beyond it."""

    def capitalised(k: int) -> bool:
        return part[k][:1].isupper() and not (first and k == 0)

    if capitalised(at):
        return True
    connector = part[at].lower() in ("of", "the")
    return connector and 0 <= beyond < len(part) and capitalised(beyond) and not plain[beyond]


def reference(question_words: list[str], mask: int) -> tuple[str, str, str] | None:
    """The link by a scan of every span against the names of DOCS made in Python (no SQL): (title, text, kind)."""
    table: dict[str, dict[str, int]] = {}
    for doc in DOCS:
        for name, kind in names_of(doc["title"], doc.get("aliases", ())):
            held = table.setdefault(name, {})
            held[normalize_title(doc["title"])] = min(kind, held.get(normalize_title(doc["title"]), kind))
    parts = [question_words[:mask], question_words[mask:]]
    stop = stopwords()
    cased = any(w[:1].isupper() and w.lower() not in stop for w in question_words)
    best = None
    offset = 0
    for part in parts:
        plain = [w.lower() in stop for w in part]
        for i in range(len(part)):
            for j in range(i, min(i + 8, len(part))):
                text = " ".join(part[i : j + 1])
                held = table.get(normalize_title(text), {})
                capital = any(w[:1].isupper() and not p for w, p in zip(part[i : j + 1], plain[i : j + 1]))
                if not held or all(plain[i : j + 1]) or (cased and not capital):
                    continue
                kind = min(held.values())
                titles = sorted(t for t, k in held.items() if k == kind)
                sides = [(i - 1, i - 2), (j + 1, j + 2)]  # the word beside the span, and the one beyond it
                beside = [(at, beyond) for at, beyond in sides if 0 <= at < len(part)]
                bare = not any(_named(part, plain, at, beyond, part is parts[0]) for at, beyond in beside)
                alone = bare and all(plain[at] for at, _ in beside)
                if not bare:
                    continue
                if kind == PART and (len(titles) > 1 or not alone):
                    continue
                rank = (True, capital, j + 1 - i, kind < PART, len(text), -(offset + i))  # one sentence: all near
                if best is None or rank > best[0]:
                    best = (rank, titles, text, kind)
        offset += len(part) + 1
    if best is None:
        return None
    (title,) = best[1]
    return title, best[2], {TITLE: "title", ALIAS: "alias", PART: "part of the title"}[best[3]]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(POOL), min_size=1, max_size=9), st.integers(0, 9), st.booleans())
def test_the_longest_span_that_names_a_title_is_linked_as_a_scan_of_every_span_finds(linked, words, at, lower):
    words = [w.lower() for w in words] if lower else words
    mask = min(at, len(words))
    question = " ".join([*words[:mask], "[MASK]", *words[mask:]]) + " ."
    found = link(linked.store, linked.index, question)
    expected = reference(words, mask)
    if expected is None:
        assert found is None
    else:
        assert (normalize_title(found.subject), found.text, found.by) == expected
        assert question[slice(*found.span)] == found.text


def test_an_alias_a_surname_and_a_title_before_its_parenthesis_link_their_article(linked):
    p = linked.predict("Durante degli Alighieri was born in [MASK] .")
    assert (p.subject, p.linked.text, p.linked.by) == ("Dante Alighieri", "Durante degli Alighieri", "alias")
    assert p.documents == ["Dante Alighieri"]  # searched as with the subject given
    given_subject = linked.predict("Durante degli Alighieri was born in [MASK] .", subject="Dante Alighieri")
    assert given_subject.linked is None and given_subject.documents == ["Dante Alighieri"]
    assert given_subject.bert_knn == p.bert_knn  # the same search, so the same answer
    assert p.to_dict()["linked"] == {
        "subject": "Dante Alighieri",
        "text": "Durante degli Alighieri",
        "span": [0, 23],
        "by": "alias",
    }
    assert link(linked.store, linked.index, "Kessling was born in [MASK] .").subject == "Oudemeer Kessling"
    assert link(linked.store, linked.index, "Kessling's birthplace is [MASK] .").text == "Kessling"
    assert link(linked.store, linked.index, "Mercury is the smallest [MASK] .").subject == "Mercury (planet)"
    assert link(linked.store, linked.index, "Nobody here was born in [MASK] .") is None
    # the subject of the mask's sentence before a longer title in a sentence before it; a capital opening a sentence
    # (or after punctuation) continues no name
    near = "Ilsa Varnhold sang, they say. Later Port Elsmere had [MASK] ."
    assert link(linked.store, linked.index, near).subject == "Port Elsmere"
    assert link(linked.store, linked.index, "People around Kessling were in [MASK] .").subject == "Oudemeer Kessling"
    assert link(linked.store, linked.index, "Tomas, Kessling was in [MASK] .").subject == "Oudemeer Kessling"
    assert link(linked.store, linked.index, "Lena Kessling was in [MASK] .") is None  # a piece of another name


def test_an_ambiguous_surname_links_nothing_until_it_names_one_article(tmp_path, encoder):
    store = writable(encoder, BertKNN.build(write_corpus(tmp_path / "c.jsonl", DOCS), tmp_path / "s", encoder).store)
    assert link(store.store, store.index, "Berg was born in [MASK] .") is None  # Anna Berg or Tomas Berg
    p = store.predict("Berg was born in [MASK] .")
    assert p.linked is None and p.subject is None  # TF-IDF, as without linking
    store.remove_documents(["c"])
    assert link(store.store, store.index, "Berg was born in [MASK] .").subject == "Anna Berg"
    store.add_documents([{"id": "h", "title": "Tomas Berg", "text": "Tomas Berg sang."}])
    assert link(store.store, store.index, "Berg was born in [MASK] .") is None


def test_linking_is_a_setting_off_in_the_papers_and_a_given_subject_overrides_it(linked):
    question = "Ilsa Varnhold was born in [MASK] ."
    on, off = linked.predict(question), linked.predict(question, link=False)
    assert on.subject == "Ilsa Varnhold" and on.documents == ["Ilsa Varnhold"]
    assert off.linked is None and off.subject is None
    paper = linked.predict(question, settings=PAPER)
    assert paper.linked is None and paper.documents == off.documents  # TF-IDF's documents, as the paper's
    other = linked.predict(question, subject="Anna Berg")
    assert other.linked is None and other.documents == ["Anna Berg"]


def test_a_store_made_before_the_names_index_answers_as_before_until_its_next_write(tmp_path, encoder):
    made = BertKNN.build(write_corpus(tmp_path / "c.jsonl", DOCS), tmp_path / "s", encoder)
    made.store.close()
    with sqlite3.connect(tmp_path / "s" / "store.sqlite") as db:  # as a store made before the index is
        db.execute("DROP TABLE names")
        db.execute("DELETE FROM meta WHERE key = 'names'")
    reader = BertKNN.load(tmp_path / "s", read_only=True)
    question = "Kessling was born in [MASK] ."
    before = reader.predict(question)
    assert before.linked is None
    assert before.bert_knn == reader.predict(question, link=False).bert_knn
    writer = BertKNN.load(tmp_path / "s")
    writer.add_documents([{"id": "z", "title": "Zeno", "text": "Zeno was born in Elea."}])  # the next write
    assert writer.predict(question).linked.subject == "Oudemeer Kessling"
    reader.refresh()
    assert reader.predict(question).linked.subject == "Oudemeer Kessling"


def test_a_dated_update_titled_as_news_wins_and_the_older_statement_is_superseded(built):
    news = {
        "id": "n1",
        "title": "Records corrected",
        "text": "Ilsa Varnhold was born in Porto. Archivists found it.",  # the question's words: the tiny model's keys
        "date": "2024-01-01",
    }
    built.add_documents([news])
    for subject in (None, "Ilsa Varnhold"):
        p = built.predict("Ilsa Varnhold was born in [MASK] .", subject=subject, settings=KNN_ONLY)
        assert sorted(p.documents) == ["Ilsa Varnhold", "Records corrected"]
        assert p.neighbours.versions == [p.neighbours.documents] and p.documents[0] == "Records corrected"
        assert p.bert_knn[0].token == "porto"
        (before,) = p.superseded
        assert (before.token, before.doc_id) == ("lisbon", "d1")
    alike = built.predict("Ilsa Varnhold was born in [MASK] .", settings=KNN_ONLY.replace(conflicts="vote"))
    assert alike.documents == ["Ilsa Varnhold"]  # the news item takes part in the subject's conflicts only


def test_a_dated_article_of_the_built_corpus_is_no_version_of_the_subject_it_names(tmp_path, encoder):
    docs = [
        {"id": "a", "title": "Ilsa Varnhold", "text": "Ilsa Varnhold was born in Lisbon.", "date": "2020-01-01"},
        {"id": "b", "title": "Porto", "text": "Ilsa Varnhold was born in Porto, the city says.", "date": "2024-01-01"},
    ]
    knn = BertKNN.build(write_corpus(tmp_path / "c.jsonl", docs), tmp_path / "s", encoder)
    p = knn.predict("Ilsa Varnhold was born in [MASK] .", settings=KNN_ONLY)
    assert p.documents == ["Ilsa Varnhold"] and p.superseded == []  # an article about Porto, as a dump dates each


def test_a_link_is_what_it_was_once_the_documents_added_are_removed(encoder, built):
    """Removing what was added leaves every link as it was (an undone edit leaves no trace): "Varnhold" names Ilsa
    Varnhold; twelve documents that use the word make it a common word (COMMON_DOCS), which names nothing; removed,
    they count no more (hidden documents count nowhere, as in TF-IDF's idf)."""
    knn = writable(encoder, built.store)
    asked = "Varnhold was born in [MASK] ."
    assert link(knn.store, knn.index, asked).subject == "Ilsa Varnhold"
    added = [{"id": f"w{i}", "title": f"Town {i}", "text": f"Varnhold is a word heard in town {i}."} for i in range(12)]
    knn.add_documents(added)
    assert link(knn.store, knn.index, asked) is None
    knn.remove_documents([d["id"] for d in added])
    assert link(knn.store, knn.index, asked).subject == "Ilsa Varnhold"
