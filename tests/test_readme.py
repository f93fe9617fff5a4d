"""The documentation's option tables (README.md and docs/*.md) and the command-line parsers list the same options,
with the same defaults."""

from __future__ import annotations

import argparse
import importlib
import re
from pathlib import Path
from unittest import mock

import pytest

from tests.conftest import REPO

README = Path(REPO) / "README.md"
DOCS = sorted((Path(REPO) / "docs").glob("*.md"))
# Commands whose options the README must list in full.
REQUIRED_TABLES = ("pipeline.main", "pipeline.preview")
# Commands whose table is checked when the README has one.
OPTIONAL_TABLES = ("pipeline.verify", "pipeline.benchmark")
HEADER = re.compile(r"^\|\s*option\s*\|\s*default\s*\|")
HELP_MENTION = re.compile(r"python -m (pipeline\.\w+) --help")


def readme_tables(path: Path = README) -> dict[str, dict[str, str]]:
    """{module: {--option: default cell}} for each `| option | default | ... |` table.

    A table belongs to the command whose `python -m pipeline.X --help` is mentioned last
    before it, within the same section.
    """
    tables: dict[str, dict[str, str]] = {}
    module = None
    lines = path.read_text().splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("#"):
            module = None
        module = (HELP_MENTION.findall(line) or [module])[-1]
        if HEADER.match(line):
            assert module, f"README line {i + 1}: an options table with no `python -m pipeline.X --help` before it"
            assert module not in tables, f"README has two option tables for {module}"
            rows = tables[module] = {}
            i += 2  # the header and the |---| line
            while i < len(lines) and lines[i].startswith("|"):
                cells = [c.strip() for c in lines[i].strip().strip("|").split("|")]
                names = re.findall(r"`(--\w+)`", cells[0])
                assert len(names) == 1, f"README line {i + 1}: the option cell should be one `--name`: {cells[0]}"
                assert names[0] not in rows, f"README lists {names[0]} twice for {module}"
                rows[names[0]] = cells[1]
                i += 1
            continue
        i += 1
    return tables


def parser_of(module_name: str) -> argparse.ArgumentParser:
    """The argparse parser of a command, without running it."""
    if module_name == "pipeline.main":
        from pipeline.options import ConvertOptions

        parser = argparse.ArgumentParser()
        ConvertOptions._add_argparse_args(parser)
        return parser
    module = importlib.import_module(module_name)
    if hasattr(module, "build_parser"):
        return module.build_parser()

    class Captured(Exception):
        pass

    captured = []

    def capture(self, *args, **kwargs):
        captured.append(self)
        raise Captured

    with mock.patch.object(argparse.ArgumentParser, "parse_args", capture), \
            mock.patch.object(argparse.ArgumentParser, "parse_known_args", capture):
        with pytest.raises(Captured):
            module.run(["--help"])
    return captured[0]


def cli_options(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    return {option: action for action in parser._actions for option in action.option_strings
            if option.startswith("--") and option != "--help"}


def _first_word(text: str) -> str:
    """'0 (auto)' -> '0', '`stretch`' -> 'stretch', 'Default: 0.2.' text -> '0.2'."""
    text = text.replace("`", "").strip()
    return re.split(r"[\s,;(]|\.(?:\s|$)", text, maxsplit=1)[0].lower()


def default_matches(cell: str, action: argparse.Action) -> bool:
    """The README's default cell says the parser's default, or what the help text says it is."""
    shown = _first_word(cell)
    stated = re.search(r"Default:\s*(.+)", action.help or "")
    if stated and _first_word(stated.group(1)) == shown:
        return True
    default = action.default
    if default is None:
        return shown in ("none", "required")
    if isinstance(default, bool):
        return shown == ("on" if default else "off")
    if isinstance(default, (int, float)):
        try:
            return float(shown) == float(default)
        except ValueError:
            return False
    return shown == str(default).lower()


def all_tables() -> dict[str, dict[str, str]]:
    """The option tables of the README and of every page in docs/: one table a command at most."""
    tables: dict[str, dict[str, str]] = {}
    for path in [README, *DOCS]:
        for module, rows in readme_tables(path).items():
            assert module not in tables, f"{path.name}: a second options table for {module}"
            tables[module] = rows
    return tables


@pytest.mark.parametrize("module", REQUIRED_TABLES + OPTIONAL_TABLES)
def test_readme_option_table_matches_the_cli(module):
    tables = all_tables()
    if module not in tables:
        assert module not in REQUIRED_TABLES, f"README has no options table for {module}"
        pytest.skip(f"README has no options table for {module}")
    documented = tables[module]
    options = cli_options(parser_of(module))
    assert sorted(set(options) - set(documented)) == [], f"options of {module} missing from the README table"
    assert sorted(set(documented) - set(options)) == [], f"README lists options {module} does not have"
    wrong = {name: (cell, options[name].default) for name, cell in documented.items()
             if not default_matches(cell, options[name])}
    assert wrong == {}, f"README defaults of {module} that differ from the CLI: {wrong}"


def test_the_checker_sees_a_missing_or_extra_option(tmp_path):
    """Guard against a parser that finds no tables or reads rows wrongly."""
    text = README.read_text()
    tables = readme_tables()
    assert {"--input_dir", "--output_dir", "--quiet", "--verbose"} <= set(tables["pipeline.main"])
    assert "--contact_sheet" in readme_tables(Path(REPO) / "docs" / "preview.md")["pipeline.preview"]
    edited = tmp_path / "README.md"
    edited.write_text(text.replace("| `--seed` | 42 |", "| `--sead` | 42 |", 1))
    broken = readme_tables(edited)["pipeline.main"]
    assert "--sead" in broken and "--seed" not in broken


def test_default_matching_rules():
    parser = argparse.ArgumentParser()
    parser.add_argument("--a", type=float, default=0.2, help="Default: 0.2.")
    parser.add_argument("--b", default=None, help="Required.")
    parser.add_argument("--c", action="store_true", help="Default: off.")
    parser.add_argument("--d", type=int, default=0, help="Default: 0, sized automatically.")
    actions = cli_options(parser)
    assert default_matches("0.2", actions["--a"]) and not default_matches("0.3", actions["--a"])
    assert default_matches("required", actions["--b"]) and not default_matches("5", actions["--b"])
    assert default_matches("off", actions["--c"]) and not default_matches("on", actions["--c"])
    assert default_matches("0 (auto)", actions["--d"])


def _slug(heading: str) -> str:
    """GitHub's anchor of a heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_every_link_between_the_pages_leads_somewhere():
    """The README's links to docs/ (and theirs back) name files and headings that exist."""
    pages = [README, *DOCS]
    assert {p.name for p in DOCS} >= {"dataflow.md", "guarantees.md", "imaging.md", "dali-pytorch.md"}
    readme_text = README.read_text()
    for doc in DOCS:  # every page of docs/ is reachable from the README
        assert f"](docs/{doc.name}" in readme_text, f"the README does not link to docs/{doc.name}"
    for page in pages:
        text = page.read_text()
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+://", target) or target.startswith("mailto:"):
                continue
            path, _, anchor = target.partition("#")
            file = (page.parent / path).resolve() if path else page
            assert file.exists(), f"{page.name}: the link {target} leads to no file"
            if anchor and file.suffix == ".md":
                headings = {_slug(h) for h in re.findall(r"^#+ (.+)$", file.read_text(), re.M)}
                assert anchor in headings, f"{page.name}: the link {target} names no heading of {file.name}"
