"""The project's own docs point inside the project: every repo path that README.md or
docs/design.md names (in inline code or a link) exists, and nothing cites a design document that
is not in the repository."""
import os
import re

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = ("README.md", "docs/design.md")
FILE_EXT = (".md", ".py", ".toml", ".ipynb", ".csv", ".json", ".txt", ".sh")


def named_paths(text: str) -> set:
    """Inline-code spans and link targets outside fenced blocks that look like repo paths: no
    spaces or call syntax, and a folder separator or a file extension."""
    prose = re.sub(r"```.*?```", "", text, flags=re.S)
    spans = re.findall(r"`([^`\n]+)`", prose) + re.findall(r"\]\(([^)\s#]+)", prose)
    return {s.rstrip("/") for s in spans
            if re.fullmatch(r"[\w.\-/]+", s) and "://" not in s and ("/" in s or s.endswith(FILE_EXT))}


def test_path_extraction():
    text = "see `lowbit/nn/` and `NOTES.md`, [notes](docs/x.md), not `x ~= q * scale` or `lowbit.convert`\n" \
           "```\n$ lowbit audit fma my.py:kernel `fenced/path.py`\n```"
    assert named_paths(text) == {"lowbit/nn", "NOTES.md", "docs/x.md"}


@pytest.mark.parametrize("doc", DOCS)
def test_every_path_a_doc_names_exists(doc):
    paths = named_paths(open(os.path.join(ROOT, doc)).read())
    assert paths  # the extraction found the doc's paths at all
    missing = sorted(p for p in paths if not os.path.exists(os.path.join(ROOT, p)))
    assert not missing, f"{doc} names paths that are not in the repository: {missing}"


def _texts():
    for d, dirs, files in os.walk(ROOT):
        dirs[:] = [x for x in dirs if not x.startswith(".") and x not in ("results", "__pycache__")]
        for f in files:
            if f.endswith((".py", ".md", ".ipynb")):
                yield os.path.relpath(os.path.join(d, f), ROOT)


def test_no_citation_of_a_design_document_outside_the_repo():
    outside = "DESIGN" + ".md"  # (spelled so this file does not cite it)
    cites = [f for f in _texts()
             if re.search(rf"(?<![\w/]){re.escape(outside)}", open(os.path.join(ROOT, f), encoding="utf-8").read())]
    assert not cites, f"these cite {outside}, which is not in the repository (docs/design.md is): {cites}"
