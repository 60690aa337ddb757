"""Seeded workloads: sessions of chat turns with start times. Pure (no I/O): the same seed gives the same schedule.

    multi-turn  conversations resending their growing history each turn (reuse within a session)
    shared      independent users (one request each) over a few long shared documents (reuse across sessions,
                invisible to session stickiness)
    unique      unique prompts of the same size (control: nothing to reuse)
    skewed      like shared, but the documents' popularity is Zipf-distributed: following the hottest prefix
                blindly would pile its traffic onto one worker

Sessions arrive as a Poisson process; a session's turns run one after another, each ``think_s`` after the last
answer. The overall request rate is about ``rate`` requests/s in every workload (multi-turn starts
``rate / turns`` sessions/s).

Every turn carries ``prefix_key``: what an oracle keys its placement on (the conversation for multi-turn, the shared
document for shared/skewed, the request for unique).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Literal

Workload = Literal["multi-turn", "shared", "unique", "skewed"]
WORKLOADS: tuple[Workload, ...] = ("multi-turn", "shared", "unique", "skewed")

_SYLLABLES = (
    "ka ri to na me so lu pe da vi mo ter an ul is ex or en qua ba ge hi jo ku la mi no pa ra se ti vo wa ya zu"
).split()


@dataclass(frozen=True)
class Shape:
    """Sizes, in words (a word is one to three tokens with a real tokenizer)."""

    requests: int = 60
    rate: float = 2.0
    """Requests per second, on average."""
    turns: int = 4
    """Turns per multi-turn conversation."""
    think_s: float = 0.5
    prefix_words: int = 500
    """System prompt (multi-turn) or shared document (shared, skewed) length."""
    question_words: int = 30
    documents: int = 4
    """Shared documents (shared); hot and cold ones (skewed) number twice as many."""
    zipf_s: float = 1.4
    """Skew of the skewed workload's document popularity."""


@dataclass(frozen=True)
class Turn:
    session: str
    prefix_key: str
    messages: tuple[dict[str, str], ...]
    """The turn's new user message is last; for multi-turn, earlier assistant turns are filled in at run time with
    what the model answered (``history_from_answers``)."""


@dataclass(frozen=True)
class Session:
    session_id: str
    start_s: float
    turns: tuple[Turn, ...]
    think_s: float
    history_from_answers: bool = False
    """Multi-turn: each turn resends the conversation so far, including the model's own answers."""


@dataclass(frozen=True)
class Schedule:
    workload: Workload
    sessions: tuple[Session, ...] = field(default_factory=tuple)

    @property
    def requests(self) -> int:
        return sum(len(s.turns) for s in self.sessions)


def _words(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(_SYLLABLES) + rng.choice(_SYLLABLES) for _ in range(n))


def _arrivals(rng: random.Random, count: int, rate: float) -> list[float]:
    t, out = 0.0, []
    for _ in range(count):
        out.append(t)
        t += rng.expovariate(rate)
    return out


def build(workload: Workload, shape: Shape, seed: int = 0) -> Schedule:
    rng = random.Random(f"{workload}:{seed}")
    if workload == "multi-turn":
        count = max(1, round(shape.requests / shape.turns))
        sessions = []
        for i, start in enumerate(_arrivals(rng, count, shape.rate / shape.turns)):
            sid = f"conv-{i}"
            system = {"role": "system", "content": f"Conversation {i}. " + _words(rng, shape.prefix_words)}
            turns = tuple(
                Turn(sid, sid, (system, {"role": "user", "content": f"Turn {t}: " + _words(rng, shape.question_words)}))
                for t in range(shape.turns)
            )
            sessions.append(Session(sid, start, turns, shape.think_s, history_from_answers=True))
        return Schedule(workload, tuple(sessions))

    documents = shape.documents * (2 if workload == "skewed" else 1)
    docs = [f"Document {d}. " + _words(rng, shape.prefix_words) for d in range(documents)]
    weights = [1.0 / (d + 1) ** shape.zipf_s for d in range(documents)] if workload == "skewed" else None
    sessions = []
    for i, start in enumerate(_arrivals(rng, shape.requests, shape.rate)):
        sid = f"user-{i}"
        question = {"role": "user", "content": f"Question {i}: " + _words(rng, shape.question_words)}
        if workload == "unique":
            system = {"role": "system", "content": f"Document for {i}. " + _words(rng, shape.prefix_words)}
            key = sid
        else:
            d = rng.choices(range(documents), weights=weights)[0] if weights else rng.randrange(documents)
            system = {"role": "system", "content": docs[d]}
            key = f"doc-{d}"
        sessions.append(Session(sid, start, (Turn(sid, key, (system, question)),), shape.think_s))
    return Schedule(workload, tuple(sessions))


def conversation(session: Session, turn_index: int, answers: list[str]) -> list[dict[str, str]]:
    """The messages turn ``turn_index`` sends: for multi-turn, the system prompt, then each earlier user turn with
    the model's answer to it, then this turn's user message; otherwise the turn's own messages."""
    turn = session.turns[turn_index]
    if not session.history_from_answers:
        return list(turn.messages)
    system = turn.messages[0]
    messages = [system]
    for earlier, answer in zip(session.turns[:turn_index], answers, strict=False):
        messages += [earlier.messages[-1], {"role": "assistant", "content": answer}]
    messages.append(turn.messages[-1])
    return messages
