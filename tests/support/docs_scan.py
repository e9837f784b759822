"""Reading README.md and docs/*.md as the docs tests do: the command lines they quote, the log
lines they quote, and the message text of the code those log lines must come from.

What counts (the rules `tests/unit/test_docs_executable.py` checks):

- **A command line** is text that starts with one of our programs (`psyche-server`,
  `psyche-client`, `psyche-local-testnet`, `psyche-data`, also after a path such as
  `.venv/bin/`, an environment assignment or a `$ ` prompt) or names a bench script
  (`bench/NAME.py`), found
  - on every line of a fenced block that is untagged or tagged `sh`, `bash`, `shell` or
    `console` (blocks tagged `text`, `json`, `toml`, `python`, `yaml`, ... are output or
    files, and are not read), and
  - in every inline code span that is not a quoted log line (below).
  A line is cut at a comment (` #`), a pipe, `&&` or `;`; backslash continuations are joined.
  The words after the program name its subcommand (and sub-subcommand, for groups); the
  `--long` and `-s` options after them are its flags. Placeholders such as `[-i KEYFILE]`
  or `...` are read as written: their flags count, their other words do not.
- **A quoted log line** is an inline code span that follows one of the words `logs`,
  `logged`, `prints`, `printed`, `warns`, `says`, `exits:`, `prefixed` or `line(s)` within
  three of the words `at start as the own also too first` (`printed at start as`; an
  opening parenthesis or quote before the span is allowed), or that is chained to such a span by `,`, `and`, `or`, `then` or `(or`.
  Its literal text must come from the code. Placeholders for what the program fills in:
  upper-case words (`KEY`, `HOST:PORT`, `N`), numbers, hexadecimal ids, `...`, `…`,
  `<name>`, bracketed text (`[a, b]`), `name=value` fields, an exception's type
  (`OSError`), the operating system's message (`[Errno 28] No space left on device`) and
  run-state names (`Warmup`). The text between them, split further at `: ` (where the code
  joins a message and the reason it carries), at parentheses and at ` | ` (alternatives), must each appear,
  whitespace and quotes aside, inside one string literal of our packages (f-string parts and
  `%s` / `{}` fields split literals the same way), save one word at either end that the
  program may fill in (`Witness not sent` from `"%s not sent"`).
"""

from __future__ import annotations

import ast
import re
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from psyche_common.run_state import RunState

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
PACKAGES = [ROOT / "common", ROOT / "server", ROOT / "client", ROOT / "local_testnet"]

COMMAND_BLOCKS = {"", "sh", "bash", "shell", "console"}
"""Fenced-block tags whose lines are read as command lines."""

PROGRAM = re.compile(
    r"(?:^|(?<=[\s`(/=]))(psyche-server|psyche-client|psyche-local-testnet|psyche-data)"
    r"(?![\w-])|(?:^|(?<=[\s`(]))(bench/[a-z_]+\.py)"
)
LONG_FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9]*(?:-[a-z0-9]+)*(?![\w-])")
SHORT_FLAG = re.compile(r"(?<![\w-])-[a-zA-Z](?![\w-])")
WORD = re.compile(r"[a-z][a-z0-9-]*")

LOG_TRIGGER = re.compile(
    r"(?<![\w-])(?:logs|logged|prints|printed|warns|says|exits:|prefixed|lines?)"
    r"(?:\s+(?:at|start|as|the|own|also|too|first)){0,3}[\s(\"']*$"
)
LOG_CHAIN = re.compile(r"^\s*(?:,|and|or|then|, and|, or|, then|\(or)\s*$")
PLACEHOLDER = re.compile(
    "|".join(
        (
            r"\[Errno \d+\][^)]*",  # the operating system's message
            r"\[[^\]]*\]",  # a list or range
            r"\.\.\.|…|<[^>]*>",
            r"\b\w+ ?= ?\S+",  # a structured field of the record
            r"\b[0-9a-f]*[0-9][0-9a-f]*\b",  # a number or a hexadecimal id
            r"\b[A-Z][A-Z0-9_]*\b",  # KEY, HOST:PORT, N
            r"\b[A-Z][A-Za-z]*Error\b",  # an exception's type
            *(rf"\b{state.name}\b" for state in RunState),
        )
    )
)
CODE_FIELD = re.compile(r"%(?:\([a-z_]+\))?[-+ #0]*\d*(?:\.\d+)?[sdifrxg]|\{[^{}]*\}")
MIN_LETTERS = 4
"""A literal piece with fewer letters and digits than this (`: `, `) (`) is not checked."""


@dataclass(frozen=True)
class Command:
    """One quoted command line: where, the program (or bench script) and the rest of it."""

    doc: Path
    line: int
    program: str
    rest: str

    @property
    def where(self) -> str:
        return f"{self.doc.relative_to(ROOT)}:{self.line}"


@dataclass(frozen=True)
class LogQuote:
    """One quoted log line: where, and its text."""

    doc: Path
    line: int
    text: str

    @property
    def where(self) -> str:
        return f"{self.doc.relative_to(ROOT)}:{self.line}"


def program_entry_points() -> dict[str, str]:
    """Program name -> `module:attribute`, as pyproject.toml installs them."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return dict(project["scripts"])


def _line_of(text: str, offset: int) -> int:
    return text.count("\n", 0, offset) + 1


def _fenced_blocks(text: str) -> Iterator[tuple[str, int, str]]:
    """(tag, line of the block's first content line, content) of every fenced block."""
    for match in re.finditer(r"^[ \t]*```([a-z]*)[ \t]*\n(.*?)^[ \t]*```", text, re.M | re.S):
        yield match.group(1), _line_of(text, match.start(2)), match.group(2)


def _inline_spans(text: str) -> Iterator[tuple[int, int, str]]:
    """(start, end, content) of every inline code span outside fenced blocks."""
    blanked = re.sub(
        r"^[ \t]*```.*?^[ \t]*```", lambda m: " " * len(m.group()), text, flags=re.M | re.S
    )
    for match in re.finditer(r"`([^`]+)`", blanked):
        yield match.start(), match.end(), match.group(1)


def log_quotes(doc: Path, text: str | None = None) -> list[LogQuote]:
    """The quoted log lines of `doc` (see the module docstring)."""
    text = doc.read_text() if text is None else text
    quotes: list[LogQuote] = []
    previous_end: int | None = None
    for start, end, content in _inline_spans(text):
        before = text[max(0, start - 40) : start]
        chained = previous_end is not None and LOG_CHAIN.match(text[previous_end:start])
        if LOG_TRIGGER.search(before) or chained:
            quotes.append(LogQuote(doc, _line_of(text, start), " ".join(content.split())))
            previous_end = end
        else:
            previous_end = None
    return quotes


def commands(doc: Path, text: str | None = None) -> list[Command]:
    """The command lines of `doc` (see the module docstring)."""
    text = doc.read_text() if text is None else text
    found: list[Command] = []
    for tag, first_line, block in _fenced_blocks(text):
        if tag not in COMMAND_BLOCKS:
            continue
        lines = block.split("\n")
        index = 0
        while index < len(lines):
            number, line = first_line + index, lines[index]
            while line.endswith("\\") and index + 1 < len(lines):
                index += 1
                line = line[:-1] + " " + lines[index]
            if tag == "console" and not line.lstrip().startswith("$ "):
                index += 1
                continue
            found += _commands_in(doc, number, line)
            index += 1
    quoted = {(quote.line, quote.text) for quote in log_quotes(doc, text)}
    for start, _, content in _inline_spans(text):
        number = _line_of(text, start)
        if (number, " ".join(content.split())) not in quoted:
            found += _commands_in(doc, number, content.replace("\n", " "))
    return found


def _commands_in(doc: Path, number: int, line: str) -> list[Command]:
    line = re.split(r"\s#|\||&&|;", line)[0]
    found = []
    for match in PROGRAM.finditer(line):
        program = match.group(1) or match.group(2)
        rest = line[match.end() :].lstrip(")\"'")  # "$(which psyche-client)" train
        found.append(Command(doc, number, program, rest))
    return found


def words_and_flags(rest: str) -> tuple[list[str], list[str]]:
    """The leading plain words of a command line (its subcommands, then arguments) and every
    flag in it."""
    words = []
    for token in rest.split():
        if not WORD.fullmatch(token):
            break
        words.append(token)
    return words, LONG_FLAG.findall(rest) + SHORT_FLAG.findall(rest)


def literal_pieces(quote: str) -> list[str]:
    """The pieces of a quoted log line that must appear in the code (see the module
    docstring), quotes removed and whitespace collapsed."""
    pieces = []
    for part in PLACEHOLDER.split(quote):
        for piece in re.split(r": |[()]", part):
            piece = " ".join(piece.replace('"', "").replace("'", "").split())
            for alternative in piece.split(" | "):
                if sum(ch.isalnum() for ch in alternative) >= MIN_LETTERS:
                    pieces.append(alternative.strip())
    return pieces


def code_text(packages: list[Path] = PACKAGES) -> str:
    """Every string literal of the packages' modules as literal pieces, one per line, with
    f-string fields and `%`/`{}` format fields as line breaks, quotes removed."""
    pieces: list[str] = []
    for package in packages:
        for path in sorted(package.rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.Constant) and isinstance(node.value, str):
                    pieces += CODE_FIELD.split(node.value)
    return "\n".join(" ".join(piece.replace('"', "").replace("'", "").split()) for piece in pieces)


def found_in(piece: str, code: str) -> bool:
    """Whether `piece` is in `code` (`code_text`), allowing one word at either end of it to be
    one the program fills in (`Witness not sent` from `%s not sent`)."""
    words = piece.split(" ")
    candidates = [piece, " ".join(words[1:]), " ".join(words[:-1])] if len(words) > 1 else [piece]
    return any(
        sum(ch.isalnum() for ch in candidate) >= MIN_LETTERS and candidate in code
        for candidate in candidates
    )
