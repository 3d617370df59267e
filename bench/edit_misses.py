"""What edits' misses are: locality after many edits split by whether the locality prompt is about an edited subject,
and what a missed paraphrase answers.

CounterFact's locality prompt of one record is about another subject, and in a long run of edits that subject is
often edited itself by another record ("Danielle Darrieux's mother tongue is" is one record's locality prompt and
another's edit). Its answer should then change, and the locality score counts that as a failure. This reads a report
of `bertknn eval edits` (edits.json, with its per-record answers) and the edits file, and prints, per mode and row,
locality over every record and over the records whose locality prompt names none of the edited subjects (whole
words, case-insensitive), and what the changed answers are: the new object of an edit of a subject the prompt names,
another answer where the prompt names one, or an answer where it names none. Then, per mode and row, the
paraphrases whose top-1 word is not the new object, by what they answer (PARAPHRASE_KINDS, first that fits), and
efficacy over the records whose subject no other record edits (another edit of the same subject, newer, may rightly
take the prompt's answer).

    python bench/edit_misses.py REPORT/edits.json [$BERTKNN_DATA/counterfact/counterfact-train.json] [--smoke]

--smoke: the committed report reports/edits/counterfact-test-1000/edits.json.
"""

from __future__ import annotations

import argparse
import json
import re
from collections import Counter, defaultdict
from pathlib import Path

from evidence import DATA, SMOKE

from bertknn.evaluation.edits_data import EditRecord, load_edits

COUNTERFACT = DATA / "counterfact" / "counterfact-train.json"
SMOKE_REPORT = Path(__file__).resolve().parents[1] / "reports" / "edits" / "counterfact-test-1000" / "edits.json"
PARAPHRASE_KINDS = ("the old object", "a word of the subject", "a word of the edit's prompt", "its answer before")
KINDS = ("new object of an edit of a subject it names", "other answer, names an edited subject", "names none")


def breakdown(report: dict, records: dict[int, EditRecord]) -> list[tuple[str, str, int, float, int, float, Counter]]:
    """(mode, row, records, locality %, records naming no edited subject, their locality %, changed answers by
    KINDS) per mode and row of `report`; `records`: the edits by case_id."""
    made = [records[r["case_id"]] for r in report["records"]]
    new_objects = defaultdict(set)
    for r in made:
        new_objects[r.subject.lower()].add(r.target_new.lower())
    names = sorted(new_objects, key=len, reverse=True)
    pattern = re.compile(r"(?<!\w)(" + "|".join(map(re.escape, names)) + r")(?!\w)", re.IGNORECASE)
    named = [{m.lower() for m in pattern.findall(r.locality_prompt)} for r in made]
    out = []
    for mode, rows in report["records"][0]["answers"].items():
        for row in rows:
            kept, clean, kept_clean, changed = 0, 0, 0, Counter()
            for record, subjects in zip(report["records"], named):
                before, after = record["answers"][mode][row]["locality"]
                clean += not subjects
                if before == after:
                    kept += 1
                    kept_clean += not subjects
                    continue
                news = {word for s in subjects for new in new_objects[s] for word in (new, new.split()[0])}
                changed[KINDS[0] if after in news else KINDS[1] if subjects else KINDS[2]] += 1
            n = len(report["records"])
            out.append((mode, row, n, 100 * kept / n, clean, 100 * kept_clean / max(clean, 1), changed))
    return out


def _words(text: str) -> set[str]:
    return set(re.findall(r"\w+", text.lower()))


def paraphrase_misses(report: dict, records: dict[int, EditRecord]) -> list[tuple[str, str, int, Counter]]:
    """(mode, row, paraphrases, misses by PARAPHRASE_KINDS, the first that fits, or "other") per mode and row of
    `report`: a miss is a paraphrase whose top-1 word after the edits is not the new object (nor its first word)."""
    out = []
    for mode, rows in report["records"][0]["answers"].items():
        for row in rows:
            misses = Counter()
            for record in report["records"]:
                edit, (before, after) = records[record["case_id"]], record["answers"][mode][row]["rephrase"]
                if _hit(record, mode, row, "rephrase"):
                    continue
                fits = (  # in the order of PARAPHRASE_KINDS
                    after in _words(edit.ground_truth),
                    after in _words(edit.subject),
                    after in _words(edit.prompt),
                    after == before,
                )
                misses[next((k for k, fit in zip(PARAPHRASE_KINDS, fits) if fit), "other")] += 1
            out.append((mode, row, len(report["records"]), misses))
    return out


def _hit(record: dict, mode: str, row: str, kind: str) -> bool:
    """Whether the top-1 word after the edits of `record`'s `kind` question is its new object (or its first word)."""
    new = record["target_new"].lower()
    return record["answers"][mode][row][kind][1] in (new, new.split()[0])


def efficacy_alone(report: dict) -> list[tuple[str, str, int, float]]:
    """(mode, row, records whose subject no other record of the report edits, their efficacy %)."""
    edited = Counter(r["subject"].lower() for r in report["records"])
    alone = [r for r in report["records"] if edited[r["subject"].lower()] == 1]
    return [
        (mode, row, len(alone), 100 * sum(_hit(r, mode, row, "rewrite") for r in alone) / max(len(alone), 1))
        for mode, rows in report["records"][0]["answers"].items()
        for row in rows
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("report", type=Path, nargs="?", help="edits.json of `bertknn eval edits`")
    parser.add_argument("edits", type=Path, nargs="?", default=COUNTERFACT)
    parser.add_argument("--smoke", action="store_true", help=SMOKE)
    args = parser.parse_args()
    report = SMOKE_REPORT if args.smoke else args.report
    if report is None:
        parser.error("give the report's edits.json (or --smoke)")
    result = json.loads(report.read_text(encoding="utf-8"))
    if not result.get("records"):
        parser.error(f"{report} has no per-record answers")
    print(f"{report}: {len(result['records']):,} edits")
    records = {r.case_id: r for r in load_edits(args.edits)}
    head = "| mode | row | locality | prompts naming no edited subject | their locality | changed: "
    print(head + " / ".join(KINDS) + " |")
    print("| --- | --- | --- | --- | --- | --- |")
    for mode, row, n, all_kept, clean, clean_kept, changed in breakdown(result, records):
        counts = " / ".join(str(changed[k]) for k in KINDS)
        print(f"| {mode} | {row} | {all_kept:.1f} | {clean:,} of {n:,} | {clean_kept:.1f} | {counts} |")
    print("\n| mode | row | paraphrases missed | " + " / ".join((*PARAPHRASE_KINDS, "other")) + " |")
    print("| --- | --- | --- | --- |")
    for mode, row, n, misses in paraphrase_misses(result, records):
        counts = " / ".join(str(misses[k]) for k in (*PARAPHRASE_KINDS, "other"))
        print(f"| {mode} | {row} | {sum(misses.values()):,} of {n:,} | {counts} |")
    print("\n| mode | row | records whose subject no other record edits | their efficacy |")
    print("| --- | --- | --- | --- |")
    for mode, row, n, efficacy in efficacy_alone(result):
        print(f"| {mode} | {row} | {n:,} | {efficacy:.2f} |")


if __name__ == "__main__":
    main()
