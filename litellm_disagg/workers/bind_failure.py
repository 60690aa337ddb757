"""Recognise an engine that could not bind one of its ports while starting.

vLLM binds its NIXL side channel in a thread of its engine core; when the port is taken the thread dies with
``zmq.error.ZMQError: Address already in use (addr='tcp://HOST:PORT')`` and the engine waits for it forever: it never
becomes ready and never exits. The wrapper reads the engine's log lines, so it can tell this apart from a slow start
and stop at once (and ``litellm-disagg worker`` can retry on another port when it picked the port itself). uvicorn's
form (``error while attempting to bind on address ('HOST', PORT): address already in use``) is recognised too.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_IN_USE = re.compile(r"address already in use", re.IGNORECASE)
_PORT = (re.compile(r"tcp://[^\s'\"]*:(\d{1,5})"), re.compile(r"\(\s*['\"][^'\"]*['\"]\s*,\s*(\d{1,5})\s*\)"))


@dataclass(frozen=True)
class BindFailure:
    line: str
    """The engine's log line that said so."""
    port: int | None
    """The port it could not bind, where the line names it."""


def parse(line: str) -> BindFailure | None:
    if not _IN_USE.search(line):
        return None
    for pattern in _PORT:
        match = pattern.search(line)
        if match and 0 < int(match.group(1)) <= 65535:
            return BindFailure(line.strip(), int(match.group(1)))
    return BindFailure(line.strip(), None)
