"""How the command line speaks: its help formatting (``HelpFormatter``, ``Parser``) and the
translation of API messages into its flags (``Flag``, ``flag_message``).

Both are about the command line's words rather than any one command: every command's parser,
plugged-in ones included, is a ``Parser``, and every command's API errors pass through
``flag_message`` (``main._classify``, ``common.check_output_argument``).
"""

from __future__ import annotations

import argparse
import re
import textwrap
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

# --- flags in API messages ----------------------------------------------------------------------


@dataclass(frozen=True)
class Flag:
    """The command-line flag that sets one API parameter."""

    option: str
    """The flag, e.g. ``--pad-id``."""
    switch: bool
    """True for an on/off flag that takes no value (``--overwrite``)."""


_VERBATIM = re.compile(r"(\[[^\]]*\]|(?<![\w=])'[^']*')")
_ASSIGNMENT = re.compile(
    r"(?<![\w'\"/.-])([a-z][a-z0-9_]*)=(?:'([^']*)'|\"([^\"]*)\"|([^\s,;)\]]+))"
)
_NAME_MUST = re.compile(r"(?<![\w'\"/.-])([a-z][a-z0-9]*) must be\b")
_CLI_HINT = re.compile(r" \((--[a-z][a-z0-9-]*) on the command line\)")
_PHRASES: Mapping[str, str] = {"tokenizer spec": "tokenizer"}
"""Phrases of API messages that stand for a parameter: ``tokenizer spec 'x'`` is ``--tokenizer``."""
_SNAKE = re.compile(r"(?<![\w'\"/.-])([a-z][a-z0-9]*(?:_[a-z0-9]+)+)(?![=\w/-]|\.\w)")


def flag_message(message: str, flags: Mapping[str, Flag]) -> tuple[str, bool]:
    """``message`` with the API parameter names in ``flags`` written as the command line's flags,
    and whether it names one of the flags.

    ``mode='pad'`` becomes ``--mode pad``, ``overwrite=True`` ``--overwrite``, ``pad_id``
    ``--pad-id``, ``seed must be`` ``--seed must be``, and ``tokenizer spec 'x'``
    ``--tokenizer 'x'`` (``_PHRASES``). A one-word name is translated only before ``=`` or
    ``must be``: ``seed`` and ``mode`` are plain English too. Nothing inside square brackets or
    quotes is touched: ``[num_records, seq_len]`` is a shape, ``'hf:t.json?bos=<s>'`` the
    user's own value. A hint for command-line users, ``(--overwrite on the command line)``, is
    dropped once the message names the flag itself.
    """

    def assignment(m: re.Match[str]) -> str:
        flag = flags.get(m.group(1))
        if flag is None:
            return m.group(0)
        value = next(g for g in (m.group(2), m.group(3), m.group(4)) if g is not None)
        if flag.switch:
            return flag.option if value == "True" else m.group(0)
        return f"{flag.option} {value}"

    def name(m: re.Match[str]) -> str:
        flag = flags.get(m.group(1))
        return m.group(0) if flag is None else m.group(0).replace(m.group(1), flag.option, 1)

    pieces = _VERBATIM.split(message)
    for i in range(0, len(pieces), 2):  # odd pieces: shapes in brackets, quoted values
        text = pieces[i]
        for phrase, dest in _PHRASES.items():
            if dest in flags:
                text = re.sub(rf"\b{phrase}\b", flags[dest].option, text)
        text = _ASSIGNMENT.sub(assignment, text)
        text = _NAME_MUST.sub(name, text)
        pieces[i] = _SNAKE.sub(name, text)
    text = "".join(pieces)
    text = _CLI_HINT.sub(lambda m: "" if text.count(m.group(1)) > 1 else m.group(0), text)
    named = any(
        re.search(rf"(?<![\w-]){re.escape(f.option)}(?![\w-])", text) for f in flags.values()
    )
    return text, named


def option_flags(parser: argparse.ArgumentParser) -> dict[str, Flag]:
    """The long flag of each option of ``parser``, by the parameter name it stands for."""
    return {
        action.dest: Flag(action.option_strings[-1], action.nargs == 0)
        for action in parser._actions
        if action.option_strings
        and action.option_strings[-1].startswith("--")
        and action.dest not in ("help", "debug")
    }


# --- the parser ---------------------------------------------------------------------------------


class HelpFormatter(argparse.HelpFormatter):
    """Help as a newcomer needs it: every option with a default says it (unless its help
    already does), prose is wrapped to the terminal, and indented lines (examples, tables) are
    kept as written."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        trivial = action.default is None or action.default is False
        if (
            action.option_strings
            and not action.required
            and not trivial
            and action.default is not argparse.SUPPRESS
            and "default" not in text
        ):
            text += " (default: %(default)s)"
        return text

    def _split_lines(self, text: str, width: int) -> list[str]:
        return textwrap.wrap(" ".join(text.split()), width, break_on_hyphens=False)

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        lines: list[str] = []
        prose: list[str] = []

        def flush() -> None:
            if prose:
                lines.extend(
                    textwrap.wrap(
                        " ".join(prose),
                        width,
                        initial_indent=indent,
                        subsequent_indent=indent,
                        break_on_hyphens=False,
                    )
                )
                prose.clear()

        for line in text.splitlines():
            if not line.strip() or line[0].isspace():
                flush()
                lines.append(indent + line if line.strip() else "")
            else:
                prose.append(line.strip())
        flush()
        return "\n".join(lines)


class Parser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose help uses ``HelpFormatter``; subcommand parsers, plugged-in
    ones included, are made of this class too."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)


def table(rows: Sequence[tuple[object, str]], width: int = 78) -> str:
    """Indented two-column rows, the second column wrapped under itself."""
    key_width = max(len(str(key)) for key, _ in rows)
    out = []
    for key, text in rows:
        head = f"  {key!s:>{key_width}}  "
        indent = " " * len(head)
        wrapped = textwrap.wrap(text, width - len(head), break_on_hyphens=False)
        out.append(head + f"\n{indent}".join(wrapped))
    return "\n".join(out)
