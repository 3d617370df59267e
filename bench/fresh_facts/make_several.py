"""Write the several-facts set: invented documents that each hold several facts of one type (a person born in one
city, educated in a second, working in a third, dying in a fourth, with a first and a second language; a company
founded in one city and run from another), and questions phrased unlike their evidence.

    python bench/fresh_facts/make_several.py [--out DIR]   # writes several_{documents,questions}.jsonl here or in DIR

Seeded, so the files it writes are the ones committed. Every answer is one wordpiece of bert-base-uncased's
vocabulary (cities and languages), so the set measures telling a document's facts apart, not spelling words.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

HERE = Path(__file__).resolve().parent
CITIES = [
    "bergen",
    "oslo",
    "zurich",
    "madrid",
    "naples",
    "dublin",
    "sofia",
    "berlin",
    "prague",
    "warsaw",
    "munich",
    "rome",
    "cairo",
    "lisbon",
    "vienna",
    "paris",
    "london",
    "athens",
    "budapest",
    "helsinki",
    "stockholm",
    "copenhagen",
    "geneva",
    "lyon",
    "milan",
    "hamburg",
    "amsterdam",
    "brussels",
    "moscow",
    "florence",
    "venice",
    "barcelona",
    "seville",
    "krakow",
    "riga",
    "tallinn",
    "vilnius",
    "porto",
    "marseille",
    "turin",
    "bologna",
    "cologne",
    "frankfurt",
    "dresden",
    "leipzig",
    "salzburg",
    "antwerp",
    "rotterdam",
    "glasgow",
    "edinburgh",
]
LANGUAGES = [
    "english",
    "french",
    "german",
    "italian",
    "spanish",
    "portuguese",
    "russian",
    "polish",
    "greek",
    "turkish",
    "dutch",
    "swedish",
    "danish",
    "norwegian",
    "finnish",
    "czech",
    "hungarian",
    "arabic",
    "japanese",
    "chinese",
]
JOBS = [
    "architect",
    "chemist",
    "botanist",
    "painter",
    "engineer",
    "surgeon",
    "historian",
    "geologist",
    "composer",
    "lawyer",
]
PRODUCTS = ["bicycles", "pianos", "lenses", "clocks", "ceramics", "textiles", "instruments", "engines"]
FIRST = [
    "Maren",
    "Doran",
    "Ilsa",
    "Varkon",
    "Torvid",
    "Selma",
    "Anouk",
    "Bastien",
    "Liesel",
    "Oskar",
    "Teodora",
    "Halvard",
    "Ysolde",
    "Piran",
    "Renske",
]
LAST_A = [
    "Holt",
    "Brak",
    "Vell",
    "Mar",
    "Tors",
    "Quen",
    "Dral",
    "Ost",
    "Hask",
    "Fen",
    "Lund",
    "Grav",
    "Skel",
    "Vor",
    "Ambr",
]
LAST_B = ["by", "wick", "mund", "ander", "stad", "holm", "vik", "gard", "ness", "dahl", "wyn", "ridge", "feld", "sen"]
COMPANY = [
    "Brakvel",
    "Ostermund",
    "Halvik",
    "Quenstad",
    "Drelholm",
    "Varnesk",
    "Toskeld",
    "Ambrevik",
    "Lundgard",
    "Feskwyn",
]
KINDS = ["Works", "Optics", "Instruments", "Company", "Foundry"]
PEOPLE, COMPANIES = 40, 20

# Evidence templates: {n} the full name, {s} the surname, {p}/{P} he or she, {h}/{H} his or her.
BORN = (
    "{n} came into the world in {x} in {y}.",
    "{n}'s birthplace was {x}, a city {p} left as a child.",
    "{P} first saw daylight in {x}.",
    "{n}'s mother gave birth to {o} in {x} in {y}.",
)
STUDIED = (
    "{s} attended university in {x}.",
    "As a student, {s} spent four years at the academy of {x}.",
    "{P} took {h} degree in {x}.",
    "{H} years of training were spent at a college in {x}.",
)
WORKED = (
    "Later {s} held a post in {x} for two decades.",
    "For most of {h} career {p} earned {h} living in {x}.",
    "{H} career took {o} to {x}, where {p} ran a workshop.",
    "{s} was employed for thirty years by a firm in {x}.",
)
DIED = (
    "{s} passed away in {x} in {y}.",
    "{P} spent {h} last days in {x}.",
    "{s} was buried in {x}, the city where {p} had breathed {h} last.",
    "{H} life ended in {x} in {y}.",
)
FIRST_LANGUAGE = (
    "At home {p} grew up speaking {x}.",
    "{H} mother tongue was {x}.",
    "{x} was the language of {h} childhood.",
)
SECOND_LANGUAGE = (
    "At school {p} later learned {x}.",
    "As an adult {p} also became fluent in {x}.",
    "{s} picked up {x} as a second language.",
)
FOUNDED = (
    "The firm was started in a small workshop in {x} in {y}.",
    "{n} was set up by two brothers in {x}.",
    "The business began in {x}, in a rented cellar.",
)
HEADQUARTERS = (
    "Today its head office stands in {x}.",
    "{n} is run from offices in {x}.",
    "The company's main seat is now in {x}.",
)
QUESTIONS = {  # relation: the question (phrased as LAMA's are)
    "place_of_birth": "{n} was born in [MASK] .",
    "place_of_education": "{n} studied in [MASK] .",
    "place_of_work": "{n} worked in [MASK] .",
    "place_of_death": "{n} died in [MASK] .",
    "native_language": "The native language of {n} is [MASK] .",
    "second_language": "The second language of {n} is [MASK] .",
    "founded_in": "{n} was founded in [MASK] .",
    "headquarters": "The headquarters of {n} is in [MASK] .",
}


def _sentence(template: str, rng: random.Random, name: str, x: str, she: bool) -> str:
    """One evidence sentence, its first letter raised."""
    p, h, o = ("she", "her", "her") if she else ("he", "his", "him")
    text = template.format(
        n=name, s=name.split()[-1], x=x.capitalize(), y=rng.randint(1820, 1990), p=p, P=p, h=h, H=h, o=o
    )
    return text[0].upper() + text[1:]


def people(rng: random.Random) -> list[tuple[dict, list[dict]]]:
    """Invented people, each with four cities and two languages."""
    out, names = [], set()
    while len(out) < PEOPLE:
        name = f"{rng.choice(FIRST)} {rng.choice(LAST_A)}{rng.choice(LAST_B)}"
        if name in names:
            continue
        names.add(name)
        she = rng.random() < 0.5
        cities, languages = rng.sample(CITIES, 4), rng.sample(LANGUAGES, 2)
        facts = list(zip(QUESTIONS, [*cities, *languages]))
        parts = [BORN, STUDIED, WORKED, DIED, FIRST_LANGUAGE, SECOND_LANGUAGE]
        said = [_sentence(rng.choice(t), rng, name, x, she) for t, (_, x) in zip(parts, facts)]
        job = rng.choice(JOBS)
        text = " ".join([f"{name} was {'an' if job[0] in 'aeiou' else 'a'} {job}.", *said[:4], *said[4:]])
        out.append(({"title": name, "text": text}, [{"relation": r, "answer": x} for r, x in facts]))
    return out


def companies(rng: random.Random) -> list[tuple[dict, list[dict]]]:
    """Invented companies, each founded in one city and run from another, with a third city named too."""
    out = []
    for i in range(COMPANIES):
        name = f"{COMPANY[i % len(COMPANY)]} {KINDS[i // len(COMPANY) + i % 2]}"
        founded, seat, plant = rng.sample(CITIES, 3)
        said = [
            f"{name} is a maker of {rng.choice(PRODUCTS)}.",
            _sentence(rng.choice(FOUNDED), rng, name, founded, False),
            _sentence(rng.choice(HEADQUARTERS), rng, name, seat, False),
            f"It also runs a factory near {plant.capitalize()}.",
        ]
        facts = [{"relation": "founded_in", "answer": founded}, {"relation": "headquarters", "answer": seat}]
        out.append(({"title": name, "text": " ".join(said)}, facts))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=HERE, help="where to write the two files (default: beside this)")
    args = parser.parse_args()
    rng = random.Random(25)
    docs, questions = [], []
    for i, (doc, facts) in enumerate(people(rng) + companies(rng)):
        doc = {"id": f"several-{i:02d}", **doc}
        docs.append(doc)
        for fact in facts:
            question = QUESTIONS[fact["relation"]].format(n=doc["title"])
            questions.append({**fact, "subject": doc["title"], "question": question, "document": doc["id"]})
    for name, rows in (("several_documents.jsonl", docs), ("several_questions.jsonl", questions)):
        (args.out / name).write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    print(f"{len(docs)} documents, {len(questions)} questions")


if __name__ == "__main__":
    main()
