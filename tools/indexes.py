"""Generate the interviewer's index pages from notebook metadata.

    python -m tools.indexes          write interviewer-index.md and coding-index.md
    python -m tools.indexes --check  exit 1 if the committed pages are out of date
"""

from __future__ import annotations

import sys

from tools.notebooks import ROOT, load_bank, notebook_paths, read_info, toc_files

PAGES = {"interviewer-index.md": "all", "coding-index.md": "coding"}


def _section_titles() -> dict[str, str]:
    bank = load_bank()
    if bank is None:
        return {}
    return {s["key"]: s["title"] for s in bank["sections"]}


def _title(path) -> str:
    import json

    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    first = "".join(cells[0]["source"]).splitlines()[0]
    return first.lstrip("# ").strip()


def render(kind: str) -> str:
    infos = [read_info(p) for p in notebook_paths()]
    titles = _section_titles()
    if kind == "coding":
        infos = [i for i in infos if i.kind == "coding"]
        head = ("# Coding questions\n\nEvery question across the sections whose answer is an implementation "
                "in `lib/` with its tests. Generated from notebook metadata by `python -m tools.indexes`.\n\n")
    else:
        head = ("# Interviewer's index\n\nEvery question in the book with its kind, difficulty, the minutes a "
                "candidate needs to answer aloud and the number of follow-ups in its ladder. Generated from "
                "notebook metadata by `python -m tools.indexes`.\n\n")
    if not infos:
        return head + "No questions of this kind yet.\n"
    rows = ["| id | question | section | kind | difficulty | minutes | follow-ups |",
            "|---|---|---|---|---|---|---|"]
    order = {f: n for n, f in enumerate(toc_files())}
    for i in sorted(infos, key=lambda i: (order.get(i.rel.removesuffix(".ipynb"), len(order)), i.rel)):
        section = titles.get(i.section, i.section)
        rows.append(f"| {i.id} | [{_title(i.path)}]({i.rel}) | {section} | {i.kind} | {i.difficulty} | "
                    f"{i.minutes} | {i.followups} |")
    return head + "\n".join(rows) + "\n"


def main(argv: list[str]) -> int:
    stale = []
    for name, kind in PAGES.items():
        text, path = render(kind), ROOT / name
        if "--check" in argv:
            if not path.is_file() or path.read_text(encoding="utf-8") != text:
                stale.append(name)
        else:
            path.write_text(text, encoding="utf-8")
    if stale:
        print(f"out of date: {', '.join(stale)} (run python -m tools.indexes)")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
