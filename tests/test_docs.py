"""The README and docs/ stay readable: generated figures, a README read in five minutes, docs a reader can
finish, no run log, and links that lead somewhere.

The figures tables come from docs/figures.json through scripts/figures.py; the checks on prose read the
Markdown as a reader does, leaving out code blocks, tables, headings and HTML comments.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
DOCS = sorted((REPO / "docs").glob("*.md"))

README_MAX_LINES = 300
MEAN_WORDS_BELOW = 20
SENTENCE_MAX_WORDS = 40
DOCS_WORDS_BELOW = 20_000

# A date as a run log writes it: 2026-12-06, 2026-11, or 12-05 with a zero that no range of figures has
# ("12-22" could be a range, so only the padded short form counts).
FULL_DATE = re.compile(r"(?<![\w.-])(?:19|20)\d\d-(?:0[1-9]|1[0-2])(?:-(?:0[1-9]|[12]\d|3[01]))?(?![\w.-])")
SHORT_DATE = re.compile(r"(?<![\w.-])(?:(?:0[1-9]|1[0-2])-0[1-9]|0[1-9]-(?:[12]\d|3[01]))(?![\w.-])")
# A commit id: 7-40 hex digits with at least one letter and one digit.
COMMIT = re.compile(r"(?<![\w/.#-])(?=[0-9a-f]*[a-f])(?=[0-9a-f]*\d)[0-9a-f]{7,40}(?![\w-])")
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def load_figures_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("figures_script", REPO / "scripts" / "figures.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def prose_lines(markdown: str) -> list[tuple[int, str]]:
    """The lines a reader reads as prose, with their numbers: no code blocks, tables, headings or HTML
    comments."""
    lines: list[tuple[int, str]] = []
    in_code = in_comment = False
    for number, line in enumerate(markdown.splitlines(), start=1):
        stripped = line.strip()
        if stripped.startswith("```"):
            in_code = not in_code
            continue
        if in_comment or stripped.startswith("<!--"):
            in_comment = "-->" not in stripped
            continue
        if in_code or stripped.startswith(("|", "#")):
            continue
        lines.append((number, stripped))
    return lines


def sentences(markdown: str) -> list[str]:
    """The sentences of `markdown`'s prose. A blank line or a list item starts a new paragraph; inline code
    counts as one word, a link as its text.

    >>> sentences("Run it. It streams.\\n\\n- One item\\n- Two: `a b. C d`. `x` too.")
    ['Run it.', 'It streams.', 'One item', 'Two: `code`.', '`code` too.']
    """
    paragraphs: list[list[str]] = [[]]
    for _, line in [(0, ""), *prose_lines(markdown)]:
        if not line or re.match(r"([-*]|\d+\.) ", line):
            paragraphs.append([])
            line = re.sub(r"^([-*]|\d+\.) ", "", line)
        if line:
            paragraphs[-1].append(line)
    found = []
    for paragraph in paragraphs:
        text = " ".join(paragraph)
        text = re.sub(r"`[^`]*`", "`code`", text)
        text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
        text = text.replace("**", "").replace("*", "")
        found += [part for part in re.split(r"(?<=[.!?])\s+(?=[A-Z0-9\"'(`])", text) if words(part)]
    return found


def words(sentence: str) -> int:
    return sum(1 for token in sentence.split() if re.search(r"\w", token))


def anchors(markdown: str) -> set[str]:
    """GitHub's anchors for the headings of `markdown`."""
    seen: dict[str, int] = {}
    found = set()
    in_code = False
    for line in markdown.splitlines():
        if line.startswith("```"):
            in_code = not in_code
        if in_code or not line.startswith("#"):
            continue
        slug = re.sub(r"[^\w\- ]", "", line.lstrip("#").strip().lower()).replace(" ", "-")
        found.add(slug if slug not in seen else f"{slug}-{seen[slug]}")
        seen[slug] = seen.get(slug, 0) + 1
    return found


def leads_somewhere(source: Path, target: str) -> bool:
    """Whether a relative link of `source` names a file that exists, and a heading of it if it names one."""
    file, _, anchor = target.partition("#")
    linked = (source.parent / file).resolve() if file else source
    if not linked.exists():
        return False
    return not anchor or linked.suffix != ".md" or anchor in anchors(linked.read_text(encoding="utf-8"))


def test_the_sentence_splitter() -> None:
    assert sentences("Run it. It streams.\n\n- One item\n- Two: `a b. C d`. `x` too.") == [
        "Run it.",
        "It streams.",
        "One item",
        "Two: `code`.",
        "`code` too.",
    ]
    assert sentences("```sh\nnot. Prose.\n```\n| a. B |\n<!-- lead: x. Y -->\n# Title. Here\nOne, e.g. two.") == [
        "One, e.g. two."
    ]


def test_figures_tables_are_rendered_from_figures_json() -> None:
    figures = load_figures_script()
    assert figures.differences() == [], "run .venv/bin/python scripts/figures.py"
    text = (REPO / "docs" / "benchmarks.md").read_text(encoding="utf-8")
    outside = figures.MARKER.sub("", text)
    typed = [line for line in outside.splitlines() if line.lstrip().startswith("|")]
    assert typed == [], "every table of docs/benchmarks.md comes from docs/figures.json"


def test_readme_is_at_most_300_lines() -> None:
    lines = README.read_text(encoding="utf-8").count("\n")
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines"


def test_readme_sentences_are_short() -> None:
    found = sentences(README.read_text(encoding="utf-8"))
    counts = [words(sentence) for sentence in found]
    mean = sum(counts) / len(counts)
    long = [sentence for sentence, n in zip(found, counts, strict=True) if n > SENTENCE_MAX_WORDS]
    assert mean < MEAN_WORDS_BELOW, f"README.md sentences average {mean:.1f} words"
    assert long == [], f"README.md sentences over {SENTENCE_MAX_WORDS} words: {long}"


def test_docs_are_under_20000_words() -> None:
    by_file = {path.name: len(path.read_text(encoding="utf-8").split()) for path in DOCS}
    assert sum(by_file.values()) < DOCS_WORDS_BELOW, f"docs/ has {sum(by_file.values())} words: {by_file}"


def test_no_dates_or_commit_ids() -> None:
    found = []
    for path in [README, *DOCS]:
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
            for pattern in (FULL_DATE, SHORT_DATE, COMMIT):
                found += [f"{path.name}:{number}: {match.group()}" for match in pattern.finditer(line)]
    assert found == []


def test_links_lead_somewhere() -> None:
    broken = []
    for path in [README, *DOCS]:
        text = path.read_text(encoding="utf-8")
        for _, line in prose_lines(text) + [(0, row) for row in text.splitlines() if row.startswith("|")]:
            for target in LINK.findall(line):
                if re.match(r"[a-z]+:", target):
                    continue
                if not leads_somewhere(path, target):
                    broken.append(f"{path.name}: {target}")
    assert broken == []


def test_readme_keeps_the_two_commands() -> None:
    text = README.read_text(encoding="utf-8")
    assert 'scripts/setup.sh && .venv/bin/specedit rewrite examples/sample.py -i "' in text
    assert "\nscripts/test.sh\n" in text
