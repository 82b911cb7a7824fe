"""The docs' generated pages: the CLI reference from ``specbind.cli.parser`` and the supported
models from ``specbind.models_table``, as Markdown.

The docs build (``docs/hooks/generated_pages.py``) puts these where a page holds the marker, so
the pages are made from the very parsers ``main`` runs and the registries ``bind`` looks models
up in: a flag added, renamed or re-documented in ``cli.py``, or a model added to ``specs/``,
shows in the next build, and nothing is committed that could drift.
Invariants: every argparse action of every command is listed, in the parser's order, with its
flags, its value's metavar or choices, its default where argparse has one that is not ``None``
or ``False``, and its help text as written; usage lines are argparse's own, wrapped at 100
columns whatever the terminal (the docs must not depend on who built them).
Trap: argparse keeps a parser's actions and its subcommands only in private attributes
(``_actions``, ``_subparsers``); they have been stable since Python 3.2, and there is no public
way to enumerate them (``format_help`` gives text, not structure). Reading them here, not
scraping the help text, is what keeps a flag's help from being cut by the wrapping.
"""

from __future__ import annotations

import argparse
from typing import Any

# Usage lines are wrapped at this width in the docs, whatever $COLUMNS the build ran with.
WIDTH = 100


def _commands(p: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """The subcommand parsers of ``p``, by name, in the order ``cli.parser`` adds them."""
    for action in p._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    raise ValueError("the specbind parser has no subcommands")


def _helps(p: argparse.ArgumentParser) -> dict[str, str]:
    """Each subcommand's one-line help, as ``specbind --help`` lists it."""
    for action in p._actions:
        if isinstance(action, argparse._SubParsersAction):
            return {c.dest: c.help or "" for c in action._choices_actions}
    return {}


def _usage(sp: argparse.ArgumentParser) -> str:
    """argparse's usage line of ``sp`` at ``WIDTH`` columns."""
    formatter = argparse.HelpFormatter(sp.prog, width=WIDTH)
    formatter.add_usage(sp.usage, sp._actions, sp._mutually_exclusive_groups, prefix="")
    return formatter.format_help().strip()


def _cell(s: str) -> str:
    """Text for one Markdown table cell: pipes escaped, whitespace folded."""
    return " ".join(s.split()).replace("|", "\\|")


def _flag(action: argparse.Action) -> str:
    if not action.option_strings:
        return f"`{action.metavar or action.dest}`"
    return ", ".join(f"`{s}`" for s in action.option_strings)


def _value(action: argparse.Action) -> str:
    if action.nargs == 0 or not action.option_strings:
        return ""
    if action.choices is not None:
        return " \\| ".join(f"`{c}`" for c in action.choices)
    metavar = action.metavar or (action.dest.upper() if action.option_strings else action.dest)
    return f"`{metavar}`"


def _default(action: argparse.Action) -> str:
    from specbind.cli import REPO

    default = action.default
    if default is None or default is False or default == [] or default is argparse.SUPPRESS:
        return ""
    if isinstance(action, argparse._VersionAction | argparse._HelpAction):
        return ""
    if default == str(REPO):  # `generate --root`: where this build ran, not a fixed value
        return "the checkout (the installed package in a wheel)"
    return f"`{default}`"


def _options(sp: argparse.ArgumentParser) -> list[str]:
    rows = ["| argument | value | default | what it does |", "|---|---|---|---|"]
    for action in sp._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        helptext = action.help if action.help and action.help != argparse.SUPPRESS else ""
        if not action.option_strings and action.nargs == "?":
            helptext = f"(optional) {helptext}"
        cells = (_flag(action), _value(action), _default(action), _cell(helptext))
        rows.append("| " + " | ".join(cells) + " |")
    return rows


def cli_markdown() -> str:
    """The reference of every ``specbind`` command, from the parsers ``main`` runs."""
    from specbind.cli import parser

    top = parser()
    helps = _helps(top)
    out = [
        "## `specbind`",
        "",
        "```text",
        "specbind [--version] {" + ",".join(_commands(top)) + "} ...",
        "```",
        "",
        "| command | what it does |",
        "|---|---|",
    ]
    out += [f"| [`{name}`](#{name}) | {_cell(helps.get(name, ''))} |" for name in _commands(top)]
    for name, sp in _commands(top).items():
        out += ["", f"## `{name}` {{#{name}}}", "", _cell(helps.get(name, "")), ""]
        out += ["```text", _usage(sp), "```", ""]
        out += _options(sp)
    return "\n".join(out) + "\n"


def _models_rows() -> list[dict[str, Any]]:
    from specbind.models_table import supported

    return supported()


def models_markdown() -> str:
    """The supported models, one row each, from the generated tables (``specbind models``)."""
    from specbind.models_table import engine_status

    rows = _models_rows()
    out = [
        "| model | `model_type` | layers | blocks | tp splits by | ep | quantized as "
        "| engine layouts |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        name = f"`{r['model']}`" + (" (default)" if r["default"] else "")
        layers = str(r["layers"]) + (f" + {r['mtp_layers']} MTP" if r["mtp_layers"] else "")
        ep = ", ".join(r["ep"]["splits_experts_of"]) if r["ep"] else "no expert family"
        engines = ", ".join(f"{e['engine']} ({engine_status(e)})" for e in r["engines"]) or "none"
        cells = (
            name,
            ", ".join(f"`{t}`" for t in r["model_types"]),
            layers,
            ", ".join(r["blocks"]),
            ", ".join(r["tp_splits"]),
            ep,
            ", ".join(r["quantization"]) or "none",
            engines,
        )
        out.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    return "\n".join(out) + "\n"
