"""The docs a reader finds: every page reachable from the README by its links, no page
over 800 lines, and every relative link naming a file that exists."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LONGEST = 800
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def _links(page: Path) -> list[Path]:
    """The local Markdown files a page links to (web addresses and anchors aside)."""
    out = []
    for target in LINK.findall(page.read_text()):
        if "://" in target or target.startswith("mailto:"):
            continue
        out.append((page.parent / target).resolve())
    return out


def test_every_relative_link_names_a_file_that_exists() -> None:
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]:
        missing = [str(target) for target in _links(page) if not target.exists()]
        assert missing == [], f"{page.relative_to(ROOT)} links to missing files: {missing}"


def test_every_page_is_reachable_from_the_readme() -> None:
    seen, todo = set(), [ROOT / "README.md"]
    while todo:
        page = todo.pop()
        if page in seen or page.suffix != ".md" or not page.exists():
            continue
        seen.add(page)
        todo += _links(page)
    pages = set((ROOT / "docs").rglob("*.md"))
    assert sorted(str(p.relative_to(ROOT)) for p in pages - seen) == []


def test_no_page_is_over_800_lines() -> None:
    long = {str(page.relative_to(ROOT)): n for page in (ROOT / "docs").rglob("*.md")
            if (n := page.read_text().count("\n")) > LONGEST}
    assert long == {}


# The pages' commands: what they name exists (the chart's values, the repository's files,
# asrpool's subcommands and flags). The guides' steps themselves run where this machine
# can run them: the client guide's in tests/test_client_guide.py, the production guide's in
# tests/nodes/test_guide.py.
BASH = re.compile(r"```bash\n(.*?)```", re.DOTALL)
SET = re.compile(r"--set\s+([A-Za-z0-9_.]+)=")
REPO_PATH = re.compile(
    r"(?<![\w./-])((?:charts|crds|docker|samples|tools|docs|bench)/[\w./-]*\w/?)")
ASRPOOL = re.compile(r"(?:^|[;&|(]\s*)(?:\.venv/bin/)?asrpool\s+([^|;&>)\n]*)")  # as a command


def _commands(page: Path) -> list[str]:
    """The page's shell commands, one per logical line (continuations joined)."""
    lines = []
    for block in BASH.findall(page.read_text()):
        lines += [line.split("#")[0].strip() for line in block.replace("\\\n", " ").splitlines()]
    return [line for line in lines if line]


def _values_paths() -> set[str]:
    import yaml

    def walk(node: object, prefix: str) -> set[str]:
        if not isinstance(node, dict):
            return {prefix}
        found = {prefix} if prefix else set()
        for key, child in node.items():
            found |= walk(child, f"{prefix}.{key}" if prefix else key)
        return found

    return walk(yaml.safe_load((ROOT / "charts/asrpool/values.yaml").read_text()), "")


def _pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def test_every_chart_value_a_page_sets_exists() -> None:
    known = _values_paths()
    for page in _pages():
        for command in _commands(page):
            unknown = [key for key in SET.findall(command) if key not in known]
            assert unknown == [], f"{page.relative_to(ROOT)}: {command}"


def test_every_repository_file_a_command_names_exists() -> None:
    for page in _pages():
        for command in _commands(page):
            missing = [path for path in REPO_PATH.findall(command)
                       if not (ROOT / path).exists()]
            assert missing == [], f"{page.relative_to(ROOT)}: {command}"


def test_every_asrpool_command_a_page_gives_parses() -> None:
    """As asrpool's own parser reads it (its handler not run); a shell variable stands
    for a value the reader has."""
    from asrpool import cli

    parser = cli.build_parser()
    for page in _pages():
        for command in _commands(page):
            for args in ASRPOOL.findall(command):
                words = shlex.split(re.sub(r'"?\$\{?\w+\}?[^"\s]*"?', "ws://example", args))
                try:
                    parser.parse_args(words)
                except SystemExit as exc:
                    raise AssertionError(f"{page.relative_to(ROOT)}: asrpool {args}") from exc
