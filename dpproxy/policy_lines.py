"""Where each key of a TOML document is written, so policy errors can point at the line.

tomllib gives values without positions. `key_positions` scans the text once and maps each
key path to the (line, column), both 1-based, of its last key: table headers (`[a.b]`,
`[[a]]`, whose entries are indexed), dotted and quoted keys, keys inside inline tables, and
array items by index. If the scan does not account for exactly the keys and items tomllib
reads, it returns nothing: no position is better than a wrong one.

>>> text = '[tables.adult.columns]\\nage = { type = "int", lower = 17 }\\n'
>>> positions = key_positions(text)
>>> positions[("tables", "adult", "columns", "age")]
(2, 1)
>>> positions[("tables", "adult", "columns", "age", "lower")]
(2, 23)
"""

from __future__ import annotations

import bisect
import re
import tomllib
from collections.abc import Iterator
from typing import Any

KeyPath = tuple[str | int, ...]  # keys, and indexes into arrays
Position = tuple[int, int]  # line, column; both 1-based

_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")
_SCALAR_END = re.compile(r"[,\]}#\r\n]")  # numbers, booleans and dates run up to one of these


class _Unexpected(Exception):
    """The scanner met text it does not understand (so it reports no positions)."""


def key_positions(text: str) -> dict[KeyPath, Position]:
    """Where each key path of a TOML document is written; {} if it cannot tell for sure."""
    try:
        document = tomllib.loads(text)
        positions = _Scanner(text).scan()
    except (tomllib.TOMLDecodeError, _Unexpected, IndexError):
        return {}
    if set(positions) != set(_paths(document, ())):
        return {}
    return positions


def _paths(value: Any, path: KeyPath) -> Iterator[KeyPath]:
    """Every key path in a decoded document, tables and arrays included."""
    children = (value.items() if isinstance(value, dict)
                else enumerate(value) if isinstance(value, list) else ())
    for key, child in children:
        yield (*path, key)
        yield from _paths(child, (*path, key))


class _Scanner:
    """One pass over a document tomllib accepts, recording where each key path starts."""

    def __init__(self, text: str) -> None:
        self.text, self.at = text, 0
        self.line_starts = [0] + [m.end() for m in re.finditer("\n", text)]
        # A key path's own definition wins over a header that only passes through it:
        # `[tables.adult]` is where tables.adult is, though `[tables.adult.columns]` came first.
        self.defined: dict[KeyPath, Position] = {}
        self.passed: dict[KeyPath, Position] = {}
        self.array_tables: dict[KeyPath, int] = {}  # `[[a]]`: the index of its latest entry

    def scan(self) -> dict[KeyPath, Position]:
        table: KeyPath = ()
        while True:
            self.skip_blank(newlines=True)
            if self.at >= len(self.text):
                return {**self.passed, **self.defined}
            if self.text.startswith("[[", self.at):
                table = self.array_table_header()
            elif self.text[self.at] == "[":
                table = self.table_header()
            else:
                self.key_value(table)
            self.expect_line_end()

    def table_header(self) -> KeyPath:
        self.at += 1
        keys = self.key()
        self.expect("]")
        name, start = keys[-1]
        path = (*self.resolve(keys[:-1]), name)
        self.defined.setdefault(path, self.position(start))
        return path

    def array_table_header(self) -> KeyPath:
        self.at += 2
        keys = self.key()
        self.expect("]]")
        name, start = keys[-1]
        array = (*self.resolve(keys[:-1]), name)
        index = self.array_tables.get(array, -1) + 1
        self.array_tables[array] = index
        self.defined.setdefault(array, self.position(start))
        self.defined[(*array, index)] = self.position(start)
        return (*array, index)

    def resolve(self, keys: list[tuple[str, int]]) -> KeyPath:
        """The key path a header's leading keys name, through the latest entry of any
        `[[array]]` on the way."""
        path: KeyPath = ()
        for name, start in keys:
            path = (*path, name)
            self.passed.setdefault(path, self.position(start))
            if path in self.array_tables:
                path = (*path, self.array_tables[path])
        return path

    def key_value(self, table: KeyPath) -> None:
        path = table
        for name, start in self.key():
            path = (*path, name)
            self.defined.setdefault(path, self.position(start))
        self.expect("=")
        self.value(path)

    def key(self) -> list[tuple[str, int]]:
        """A dotted key: each part's name and where it starts."""
        parts = []
        while True:
            self.skip_blank()
            start = self.at
            if self.text[start] in "\"'":
                end = self.string_end(self.text[start])
                name = tomllib.loads(f"k = {self.text[start:end]}")["k"]
            else:
                match = _BARE_KEY.match(self.text, start)
                if match is None:
                    raise _Unexpected(start)
                end, name = match.end(), match.group()
            parts.append((name, start))
            self.at = end
            self.skip_blank()
            if self.text[self.at] != ".":
                return parts
            self.at += 1

    def value(self, path: KeyPath) -> None:
        self.skip_blank()
        char = self.text[self.at]
        if char == "[":
            self.array(path)
        elif char == "{":
            self.inline_table(path)
        elif char in "\"'":
            self.at = self.string_end(char)
        else:
            match = _SCALAR_END.search(self.text, self.at)
            end = match.start() if match else len(self.text)
            if end == self.at:
                raise _Unexpected(self.at)
            self.at = end

    def array(self, path: KeyPath) -> None:
        self.at += 1
        index = 0
        while True:
            self.skip_blank(newlines=True)
            if self.text[self.at] == "]":
                self.at += 1
                return
            self.defined[(*path, index)] = self.position(self.at)
            self.value((*path, index))
            self.skip_blank(newlines=True)
            if self.text[self.at] == ",":
                self.at += 1
                index += 1
            elif self.text[self.at] != "]":
                raise _Unexpected(self.at)

    def inline_table(self, path: KeyPath) -> None:
        self.at += 1
        while True:
            self.skip_blank(newlines=True)
            if self.text[self.at] == "}":
                self.at += 1
                return
            self.key_value(path)
            self.skip_blank(newlines=True)
            if self.text[self.at] == ",":
                self.at += 1
            elif self.text[self.at] != "}":
                raise _Unexpected(self.at)

    def string_end(self, quote: str) -> int:
        """Where the string starting at `self.at` ends (one past its closing quote)."""
        text, start = self.text, self.at
        triple = text.startswith(quote * 3, start)
        at = start + (3 if triple else 1)
        while at < len(text):
            if text[at] == "\\" and quote == '"':
                at += 2
            elif triple and text.startswith(quote * 3, at):
                end = at + 3
                while end < len(text) and end < at + 5 and text[end] == quote:
                    end += 1  # up to two quotes just before the closing three are content
                return end
            elif not triple and text[at] == quote:
                return at + 1
            else:
                at += 1
        raise _Unexpected(start)

    def skip_blank(self, newlines: bool = False) -> None:
        """Past spaces and tabs; with `newlines`, past line ends and comments too."""
        text = self.text
        while self.at < len(text):
            char = text[self.at]
            if char in " \t" or (newlines and char in "\r\n"):
                self.at += 1
            elif newlines and char == "#":
                end = text.find("\n", self.at)
                self.at = len(text) if end < 0 else end
            else:
                return

    def expect_line_end(self) -> None:
        self.skip_blank()
        if self.at < len(self.text) and self.text[self.at] not in "#\r\n":
            raise _Unexpected(self.at)

    def expect(self, token: str) -> None:
        self.skip_blank()
        if not self.text.startswith(token, self.at):
            raise _Unexpected(self.at)
        self.at += len(token)

    def position(self, at: int) -> Position:
        line = bisect.bisect_right(self.line_starts, at)
        return line, at - self.line_starts[line - 1] + 1
