"""Per section of the question bank: questions in the bank, notebooks present, and strays."""

from __future__ import annotations

import sys

from tools.notebooks import BANK, load_bank, notebook_paths, read_info


def main() -> int:
    bank = load_bank()
    if bank is None:
        print(f"question bank not found at {BANK} (set QUESTION_BANK=path/to/question-bank.yaml)")
        return 2
    infos = [read_info(p) for p in notebook_paths()]
    have = {i.slug for i in infos}
    bank_slugs = {q["slug"] for q in bank["questions"]}
    total_have = 0
    print(f"{'section':<22}{'bank':>6}{'notebooks':>11}  missing")
    for sec in bank["sections"]:
        qs = [q for q in bank["questions"] if q["section"] == sec["key"]]
        present = [q for q in qs if q["slug"] in have]
        total_have += len(present)
        missing = [q["id"] for q in qs if q["slug"] not in have]
        shown = ", ".join(missing[:12]) + (f" (+{len(missing) - 12} more)" if len(missing) > 12 else "")
        print(f"{sec['key']:<22}{len(qs):>6}{len(present):>11}  {shown}")
    print(f"{'total':<22}{len(bank['questions']):>6}{total_have:>11}")
    strays = [i.rel for i in infos if i.slug not in bank_slugs]
    if strays:
        print("notebooks whose slug is not in the bank:")
        for s in strays:
            print(f"  {s}")
        return 1
    print("no notebook outside the bank")
    return 0


if __name__ == "__main__":
    sys.exit(main())
