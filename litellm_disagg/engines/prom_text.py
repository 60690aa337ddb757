"""Prometheus text exposition (an engine's ``/metrics`` page) read into typed samples. Pure and small.

``samples(text, wanted)`` yields one ``Sample`` (name, labels, value) per sample line. ``wanted`` (a ``Wanted``, built
once from metric names) keeps only those names and is the fast path: the page is searched for each wanted name (a C
scan) and only the lines found are parsed, so a page of mostly histogram buckets costs little (the router's load
scraper reads every worker's page four times a second). A ``Wanted`` can also skip reading label sets a reader does
not look at (``labelled``) and keep only the samples with one label value (``where``), both without building label
dicts. ``sums`` adds each wanted name's samples up.

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
_NO_LABELS: Final[Mapping[str, str]] = MappingProxyType({})
"""The labels of a sample whose labels were not read (shared, read-only)."""


class Sample(NamedTuple):
    name: str
    labels: Mapping[str, str]
    value: float


class Wanted:
    """The metric names a reader wants from a page; build once, reuse for every page.

    ``labelled``: the names whose label sets the reader looks at (default: all of them). Samples of the other names
    come with empty labels: a hot reader that only adds values up skips reading them. ``where``: name -> (label,
    value): of that name, only the samples whose label has that value (checked without reading the label set).
    """

    __slots__ = ("names", "labelled", "where", "_searches")

    def __init__(
        self,
        names: Iterable[str],
        *,
        labelled: Iterable[str] | None = None,
        where: Mapping[str, tuple[str, str]] | None = None,
    ):
        self.names: tuple[str, ...] = tuple(sorted(set(names)))
        self.labelled: frozenset[str] = frozenset(self.names if labelled is None else labelled)
        self.where: Mapping[str, tuple[str, str]] = MappingProxyType(dict(where or {}))
        # Per name: the name at a line start, its length, whether to read labels, the label filter (as the two ways
        # the pair can appear in a label set without escapes) or None.
        self._searches = tuple(
            (name, "\n" + name, len(name) + 1, name in self.labelled, self._needles(name)) for name in self.names
        )

    def _needles(self, name: str) -> tuple[str, str, str, str] | None:
        if name not in self.where:
            return None
        label, value = self.where[name]
        pair = f'{label}="{value}"'
        return "{" + pair, "," + pair, label, value

    def __repr__(self) -> str:
        return f"Wanted({list(self.names)!r}, labelled={sorted(self.labelled)!r}, where={dict(self.where)!r})"


def samples(text: str, wanted: Wanted | None = None) -> Iterator[Sample]:
    """The page's samples. Without ``wanted``: all of them, in page order. With it: only those names (and label
    values), grouped by name (in page order within one name)."""
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
    # buckets nobody asked for. A match counts when the name ends there: a label set or a blank follows. The common
    # line (no backslash) is read in place, without slicing it out; anything else goes through _sample.
    text = "\n" + text
    escapes = "\\" in text
    for name, pattern, after, with_labels, needles in wanted._searches:
        at = text.find(pattern)
        while at >= 0:
            start = at + after
            end = text.find("\n", start)
            if end < 0:
                end = len(text)
            at = text.find(pattern, end)
            follows = text[start : start + 1]
            if follows not in _NAME_ENDS:
                continue
            labels = _NO_LABELS
            value_at = start
            if follows == "{":
                close = text.find('"}', start, end)
                if close < 0 or not text.count('"', start, close) % 2 or (escapes and text.find("\\", start, end) >= 0):
                    found = _sample(name, text[start - after + 1 : end], after - 1)  # the careful way
                    if found is not None and (needles is None or found.labels.get(needles[2]) == needles[3]):
                        yield found if with_labels else _new_sample(Sample, (name, _NO_LABELS, found.value))
                    continue
                if needles is not None and (
                    not text.startswith(needles[0], start) and text.find(needles[1], start, close + 1) < 0
                ):
                    continue
                if with_labels:
                    labels = dict(_PAIR.findall(text, start + 1, close + 1))
                value_at = close + 2
            elif needles is not None:
                continue  # no labels, so not the wanted label value
            fields = text[value_at:end].split(None, 1)
            try:
                if fields:
                    yield _new_sample(Sample, (name, labels, float(fields[0])))
            except ValueError:
                pass


def sums(text: str, wanted: Wanted) -> dict[str, float]:
    """Each wanted name's samples added up over their label sets (names absent from the page are absent here)."""
    out: dict[str, float] = {}
    for name, _, value in samples(text, wanted):
        out[name] = out.get(name, 0.0) + value
    return out


_new_sample = tuple.__new__  # a NamedTuple without its Python-level __new__: this runs once per sample read


def _name_end(line: str) -> int:
    end = len(line)
    for stop in _NAME_ENDS:
        at = line.find(stop, 0, end)
        if at >= 0:
            end = at
    return end if end < len(line) else -1


def _sample(name: str, line: str, at: int) -> Sample | None:
    """The sample of ``line``, whose ``name`` ends at ``at``; None when the rest does not parse."""
    labels: Mapping[str, str] = _NO_LABELS
    if line.startswith("{", at):
        # Fast path: without a backslash no label value holds a quote, so quotes alternate open/close and the first
        # '"}' whose quote closes a value (an odd number of quotes before it) ends the label set.
        close = line.find('"}', at) if "\\" not in line else -1
        if close >= 0 and line.count('"', at, close) % 2:
            labels = dict(_PAIR.findall(line, at + 1, close + 1))
            at = close + 2
        else:
            read: dict[str, str] = {}
            at = _labels(line, at + 1, read)
            if at < 0:
                return None
            labels = read
    fields = line[at:].split(None, 1)
    if not fields:
        return None
    try:
        return _new_sample(Sample, (name, labels, float(fields[0])))
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
