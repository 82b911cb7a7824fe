"""The docs' generated pages hold what the code holds: every command and argument of the
parsers ``main`` runs, every generated model, and the included benchmark files with their links
made right for the site (``specbind/cli_reference.py``, ``docs/hooks/generated_pages.py``)."""

from __future__ import annotations

import argparse
import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType

import pytest

from specbind.cli import COMMANDS, parser
from specbind.cli_reference import cli_markdown, models_markdown
from specbind.models_table import engine_status, supported

REPO = Path(__file__).resolve().parents[2]


def _hook() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "generated_pages", REPO / "docs" / "hooks" / "generated_pages.py"
    )
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules["generated_pages"] = module
    spec.loader.exec_module(module)
    return module


def _subparsers() -> dict[str, argparse.ArgumentParser]:
    for action in parser()._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    raise AssertionError("no subcommands")


def test_every_command_and_every_flag_of_the_parsers_is_in_the_cli_reference() -> None:
    page = cli_markdown()
    subs = _subparsers()
    assert set(subs) == set(COMMANDS)
    for name, sp in subs.items():
        assert f"## `{name}` {{#{name}}}" in page, name
        section = page.split(f"## `{name}` {{#{name}}}", 1)[1].split("\n## ", 1)[0]
        for action in sp._actions:
            if isinstance(action, argparse._HelpAction):
                continue
            for flag in action.option_strings or [action.dest]:
                assert f"`{flag}`" in section, f"{name}: {flag}"
            if action.help:
                assert " ".join(action.help.split()).replace("|", "\\|") in section, (
                    name,
                    action.help,
                )


def test_the_cli_reference_does_not_depend_on_where_it_was_built() -> None:
    page = cli_markdown()
    assert str(REPO) not in page
    assert "the checkout (the installed package in a wheel)" in page  # generate --root


def test_every_generated_model_is_a_row_of_the_models_page() -> None:
    rows = [line for line in models_markdown().splitlines() if line.startswith("| `")]
    assert [r.split("`")[1] for r in rows] == [m["model"] for m in supported()]


def test_the_models_page_gives_each_engine_proof_as_specbind_models_does() -> None:
    """The tps a layout is proven at, or the engine's measured reason it is not, on the page
    (Phi's head bias vLLM does not hold), not a bare proved / unproven."""
    page = models_markdown()
    for m in supported():
        for e in m["engines"]:
            cell = " ".join(f"{e['engine']} ({engine_status(e)})".split()).replace("|", "\\|")
            assert cell in page, m["model"]
    assert "proved at tp 1, 2 by" in page and "unproven: measured" in page


def test_the_hook_fills_each_marker_and_refuses_an_unknown_one() -> None:
    hook = _hook()

    class File:
        src_uri = "reference/cli.md"

    class Page:
        file = File()

    out = hook.on_page_markdown("# CLI\n\n<!-- generated: cli -->\n", Page(), None, None)
    assert "## `bind` {#bind}" in out and "<!-- generated" not in out
    with pytest.raises(ValueError, match="unknown generated page part 'nope'"):
        hook.on_page_markdown("<!-- generated: nope -->\n", Page(), None, None)


def test_an_included_file_links_into_docs_relative_to_its_page_and_to_the_other_included_page() -> (
    None
):
    hook = _hook()
    assert hook._relink("docs/img/a.svg", "BENCHMARKS.md", "benchmarks/index.md") == "../img/a.svg"
    assert hook._relink("benchmarks/LOG.md", "BENCHMARKS.md", "benchmarks/index.md") == "log.md"
    assert hook._relink("../BENCHMARKS.md", "benchmarks/LOG.md", "benchmarks/log.md") == "index.md"
    assert (
        hook._relink("https://x.org/a.md", "BENCHMARKS.md", "benchmarks/index.md")
        == "https://x.org/a.md"
    )


def test_the_conventions_name_exactly_the_commands_that_take_model_and_set() -> None:
    """The hand-written sentences of docs/reference/cli.md about --model and --set, against the
    parsers (the drift this page once had: `audit` said to take --set and to take none)."""
    text = " ".join((REPO / "docs" / "reference" / "cli.md").read_text(encoding="utf-8").split())
    subs = _subparsers()

    def taking(flag: str) -> set[str]:
        return {n for n, sp in subs.items() if any(flag in a.option_strings for a in sp._actions)}

    without_model = re.search(r"Every command but (.+?) takes `--model NAME`", text)
    assert without_model, "the --model sentence is gone from cli.md"
    assert set(subs) - set(re.findall(r"`(\w+)`", without_model[1])) == taking("--model")
    with_set = re.search(r"\); ((?:`\w+`,? )+and `\w+`) take `--set NAME=INT`", text)
    assert with_set, "the --set sentence is gone from cli.md"
    assert set(re.findall(r"`(\w+)`", with_set[1])) == taking("--set")
