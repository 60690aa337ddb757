"""Prometheus text exposition (an engine's ``/metrics`` page) read into typed samples. Pure and small.

``samples(text, wanted)`` yields one ``Sample`` (name, labels, value) per sample line. ``wanted`` (a ``Wanted``, built
once from metric names) keeps only those names and is the fast path: the page is searched for each wanted name (a C
scan) and only the lines found are parsed, so a page of mostly histogram buckets costs little (the router's load
scraper reads every worker's page four times a second). ``sums`` adds each wanted name's samples up.

Read as the format says: a name, optional ``{label="value",...}`` (values may hold escaped quotes, backslashes,
newlines, and ``}`` or ``,``), a value (``NaN``, ``+Inf``, ``-Inf`` included), an optional timestamp (ignored).
Comment lines (``# HELP``, ``# TYPE``) and lines that do not parse are skipped, never raised on: a page is untrusted
input and one odd line must not hide the rest.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping
from types import MappingProxyType
from typing import Final, NamedTuple

_LABEL = re.compile(r'[ \t]*([a-zA-Z_][a-zA-Z0-9_]*)[ \t]*=[ \t]*"([^"\\]*(?:\\.[^"\\]*)*)"[ \t]*(,?)[ \t]*')
_PAIR = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)[ \t]*=[ \t]*"([^"]*)"')
_UNESCAPE = re.compile(r"\\(.)")
_ESCAPES: Final[Mapping[str, str]] = MappingProxyType({"n": "\n", "\\": "\\", '"': '"'})
_NAME_ENDS: Final = ("{", " ", "\t")


class Sample(NamedTuple):
    name: str
    labels: Mapping[str, str]
    value: float


class Wanted:
    """The metric names a reader wants from a page; build once, reuse for every page."""

    __slots__ = ("names",)

    def __init__(self, names: Iterable[str]):
        self.names: tuple[str, ...] = tuple(sorted(set(names)))

    def __repr__(self) -> str:
        return f"Wanted({sorted(self.names)!r})"


def samples(text: str, wanted: Wanted | None = None) -> Iterator[Sample]:
    """The page's samples. Without ``wanted``: all of them, in page order. With it: only those names, grouped by
    name (in page order within one name)."""
    if wanted is None:
        for line in text.splitlines():
            if line and line[0] != "#":
                end = _name_end(line)
                if end > 0:
                    found = _sample(line[:end], line, end)
                    if found is not None:
                        yield found
        return
    # One str.find scan per wanted name (C speed) instead of a Python step per line: a page is mostly histogram
    # buckets nobody asked for. A match counts when the name ends there: a label set or a blank follows.
    text = "\n" + text
    for name in wanted.names:
        pattern = "\n" + name
        after = len(pattern)
        at = text.find(pattern)
        while at >= 0:
            end = text.find("\n", at + after)
            if end < 0:
                end = len(text)
            if text[at + after : at + after + 1] in _NAME_ENDS:
                found = _sample(name, text[at + 1 : end], after - 1)
                if found is not None:
                    yield found
            at = text.find(pattern, end)


def sums(text: str, wanted: Wanted) -> dict[str, float]:
    """Each wanted name's samples added up over their label sets (names absent from the page are absent here)."""
    out: dict[str, float] = {}
    for name, _, value in samples(text, wanted):
        out[name] = out.get(name, 0.0) + value
    return out


def _name_end(line: str) -> int:
    end = len(line)
    for stop in _NAME_ENDS:
        at = line.find(stop, 0, end)
        if at >= 0:
            end = at
    return end if end < len(line) else -1


def _sample(name: str, line: str, at: int) -> Sample | None:
    """The sample of ``line``, whose ``name`` ends at ``at``; None when the rest does not parse."""
    labels: dict[str, str] = {}
    if line.startswith("{", at):
        # Fast path: without a backslash no label value holds a quote, so quotes alternate open/close and the first
        # '"}' whose quote closes a value (an odd number of quotes before it) ends the label set.
        close = line.find('"}', at) if "\\" not in line else -1
        if close >= 0 and line.count('"', at, close) % 2:
            labels = dict(_PAIR.findall(line, at + 1, close + 1))
            at = close + 2
        else:
            at = _labels(line, at + 1, labels)
            if at < 0:
                return None
    fields = line[at:].split(None, 1)
    if not fields:
        return None
    try:
        return Sample(name, labels, float(fields[0]))
    except ValueError:
        return None


def _labels(line: str, at: int, into: dict[str, str]) -> int:
    """Read ``name="value",...}`` from ``at`` into ``into``; the index after the ``}``, or -1 when malformed."""
    match = _LABEL.match
    while True:
        if line.startswith("}", at):
            return at + 1
        found = match(line, at)
        if found is None:
            return -1
        key, value, comma = found.groups()
        into[key] = _UNESCAPE.sub(_unescape, value) if "\\" in value else value
        at = found.end()
        if not comma:
            return at + 1 if line.startswith("}", at) else -1


def _unescape(match: re.Match[str]) -> str:
    char = match.group(1)
    return _ESCAPES.get(char, "\\" + char)
