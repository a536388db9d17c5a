"""The docs stay reference-sized and linked: every relative link and #anchor between README.md and docs/*.md
resolves (GitHub's heading slugs), no line of the docs or of the jobs/ scripts passes 120 characters, and no
doc passes 3,000 words (issue 29)."""
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
SCRIPTS = sorted(p for p in (REPO / "jobs").rglob("*") if p.is_file() and p.suffix in (".sh", ".sbatch"))
MAX_LINE = 120
MAX_WORDS = 3000


def _prose(path):
    """(line number, line) of a markdown file outside fenced code blocks."""
    fenced = False
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        if not fenced:
            yield n, line


def github_slug(heading):
    """GitHub's anchor of a heading: lower case, punctuation but '-' and '_' dropped, spaces to '-'."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(path):
    seen, found = {}, set()
    for _, line in _prose(path):
        m = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if m:
            slug = github_slug(m.group(1))
            count = seen.get(slug, 0)
            seen[slug] = count + 1
            found.add(slug if count == 0 else f"{slug}-{count}")
        found.update(re.findall(r'<a (?:name|id)="([^"]+)"', line))
    return found


def test_slug_follows_github():
    assert github_slug("Parallel partitioning: `--method stream`") == "parallel-partitioning---method-stream"
    assert github_slug("`part-NNNNN.h5` — one rank's share") == "part-nnnnnh5--one-ranks-share"


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_relative_links_and_anchors_resolve(doc):
    broken = []
    for n, line in _prose(doc):
        for target in re.findall(r"\]\(([^)\s]+)\)", line):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target):
                continue                                    # http:, https:, mailto:
            path, _, anchor = target.partition("#")
            dest = (doc.parent / path).resolve() if path else doc
            if not dest.exists():
                broken.append(f"{doc.name}:{n}: {target}: no such file")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                broken.append(f"{doc.name}:{n}: {target}: no heading with that anchor")
    assert not broken, "\n".join(broken)


@pytest.mark.parametrize("path", DOCS + SCRIPTS, ids=lambda p: str(p.relative_to(REPO)))
def test_lines_within_120_characters(path):
    long = [f"{path.name}:{n}: {len(line)}" for n, line in
            enumerate(path.read_text(encoding="utf-8").splitlines(), 1) if len(line) > MAX_LINE]
    assert not long, "\n".join(long)


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_doc_within_3000_words(doc):
    words = len(doc.read_text(encoding="utf-8").split())
    assert words <= MAX_WORDS, f"{doc.name}: {words} words (reference docs stay within {MAX_WORDS})"


def test_readme_cora_example_reads_only_the_repository():
    """The README's Cora example runs on a fresh clone: every file it reads is in the repository (it read
    ../shared/datasets/cora.npz, which a clone does not have)."""
    text = (REPO / "README.md").read_text(encoding="utf-8")
    block = re.search(r"## A Cora example\n+```bash\n(.*?)```", text, re.S)
    assert block, "README.md has no bash block under 'A Cora example'"
    inputs = re.findall(r"g3-prepare npz (\S+)", block.group(1))
    assert inputs and all((REPO / p).is_file() and not p.startswith("..") for p in inputs), inputs


def test_docs_import_only_files_of_the_repository():
    """Every `g3-prepare npz FILE` of README.md and docs/ reads a file a clone has (docs/MODELS.md's Chameleon
    example read ../shared/datasets, which a clone does not have)."""
    inputs = {(doc.name, p) for doc in DOCS for p in re.findall(r"g3-prepare npz (\S+)", doc.read_text("utf-8"))}
    assert len(inputs) >= 3
    missing = [f"{doc}: {p}" for doc, p in sorted(inputs) if p.startswith("..") or not (REPO / p).is_file()]
    assert not missing, missing
