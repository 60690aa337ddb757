"""PrefillProgress: how far each worker has got through the prompts this router sent it, estimated between the facts.

The router knows two facts per prompt: when it sent it to a worker, and when its prefill was over there (the first
streamed chunk, the prompt's last block in the worker's KV events, a remote prefill's response). Between the two it
only knows the sum of what is outstanding (``Accounting``'s in-flight prefill tokens), which reads the same for a
worker nine tenths through a 4,000-token prompt and one that received it a moment ago. When every worker is busy
with a cold prompt, the next cold prompt then goes to one of them by chance, and waits behind a whole prefill where
another worker was nearly done (issue 13, item 3 at a fifth of the simulator's speed: every missed run's p99).

The estimate: a worker computes the prompts it was sent one after another, in the order sent (vLLM schedules its
waiting queue first come, first served), each from the later of its sending and the estimated end of the one before,
the first from the later of its sending and the last prefill seen over there. Each takes ``overhead_s + tokens /
tokens_per_s`` of a line fitted from the prefills seen over: a prompt's tokens against the time from the later of
its sending and the previous prefill seen over on the same worker (``OnlineLinearFit``, the configured prior until
it has observations). ``computed(worker, now)``: the tokens of the worker's pending prompts estimated computed by
now.

The line is least sure where it matters most: until prompts of varied sizes have been seen over it is the prior rate
(10,000 tokens/s by default; simulated workers at a fifth of their speed prefill 4,400), and a prompt read as
finished is a tie with every other prompt read as finished, decided by chance (a first try: with every cold prompt
read done after 0.5 s, the next cold prompt went to a worker 0.44 of its way through while two others were 0.70
through). So the line's fraction done ``x`` (its time on the worker less the overhead, times the rate, over its
tokens) is trusted to one half; past that, what is left decays as ``1 / (4x)`` (the same value and slope at one
half, a quarter left at the line's end, an eighth at twice it): a prompt never reads finished before it is seen
over, and of two prompts the one sent earlier always reads less left, however wrong the rate. The next prompt on
the worker begins at the line's end of the one before.

Pure bookkeeping and arithmetic, fed by ``Accounting`` (``sent``, ``over``, ``dropped``: the ``PrefillWatcher``
protocol); the router reads ``computed_all`` into the scoring context (``ScoringContext.prefill_computed``), where
the ``kv_cost`` scorer subtracts it from the worker's queued prefill tokens. Only this replica's own prompts: the
other proxy replicas' queued tokens (shared through Redis) count whole, as before.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable

from litellm_disagg.routing.kv.disagg_decision import LinearEstimate, OnlineLinearFit


class PrefillProgress:
    def __init__(self, prior: LinearEstimate, *, halflife_observations: float = 50.0):
        self.line = OnlineLinearFit(prior, halflife_observations=halflife_observations, one_size="overhead")
        """Seconds a prefill takes on its worker once the worker turns to it, against its tokens. Observations of
        one size keep the prior rate and fit the overhead: a prefill is seen over with the first token, one engine
        step later, so short prompts (cache hits: a few dozen tokens each) measure that step, not the rate; fitted
        as a rate they had read 750 tokens/s on simulated workers that prefill 4,400 (a first try)."""
        self._pending: dict[str, dict[Hashable, tuple[int, float]]] = {}
        """Per worker, its pending prompts in the order sent: key -> (tokens, sent at)."""
        self._worker_of: dict[Hashable, str] = {}
        self._last_over: dict[str, float] = {}
        """Per worker, when a prefill was last seen over there."""

    def sent(self, key: Hashable, worker_id: str, tokens: int, at: float) -> None:
        """A prompt of ``tokens`` tokens to compute was sent to ``worker_id`` at ``at`` (replacing any under
        ``key``)."""
        self.dropped(key)
        if tokens <= 0:
            return
        self._pending.setdefault(worker_id, {})[key] = (tokens, at)
        self._worker_of[key] = worker_id

    def over(self, key: Hashable, at: float) -> None:
        """The prompt under ``key`` was seen prefilled at ``at``: one observation of the line (its tokens against
        the time since the later of its sending and the previous prefill seen over on its worker)."""
        worker_id = self._worker_of.pop(key, None)
        if worker_id is None:
            return
        pending = self._pending[worker_id]
        tokens, sent_at = pending.pop(key)
        if not pending:
            del self._pending[worker_id]
        previous = self._last_over.get(worker_id)
        began = sent_at if previous is None or previous < sent_at else previous
        if at >= began:
            self.line.observe(tokens, at - began)
        self._last_over[worker_id] = at

    def dropped(self, key: Hashable) -> None:
        """The prompt under ``key`` stopped counting without its prefill seen over (the call failed or ended
        unstreamed): no observation."""
        worker_id = self._worker_of.pop(key, None)
        if worker_id is None:
            return
        pending = self._pending[worker_id]
        del pending[key]
        if not pending:
            del self._pending[worker_id]

    def forget(self, worker_id: str) -> None:
        """A worker left: its pending prompts and its last prefill go."""
        for key in self._pending.pop(worker_id, {}):
            self._worker_of.pop(key, None)
        self._last_over.pop(worker_id, None)

    def computed(self, worker_id: str, now: float, line: LinearEstimate | None = None) -> int:
        """Tokens of ``worker_id``'s pending prompts estimated computed by ``now`` (the module's docstring)."""
        pending = self._pending.get(worker_id)
        if not pending:
            return 0
        line = self.line.estimate() if line is None else line
        free_at = self._last_over.get(worker_id, _NEVER)
        return int(_computed(pending.values(), free_at, line.overhead_s, line.tokens_per_s, now) + 0.5)

    def computed_all(self, now: float) -> dict[str, int]:
        """``computed`` of every worker with a prompt pending and some of it estimated computed (absent: 0). Runs
        once per routing decision: one pass, the line estimated once."""
        if not self._pending:
            return {}
        line = self.line.estimate()
        overhead, rate = line.overhead_s, line.tokens_per_s
        last_over = self._last_over.get
        out: dict[str, int] = {}
        for worker_id, pending in self._pending.items():
            done = int(_computed(pending.values(), last_over(worker_id, _NEVER), overhead, rate, now) + 0.5)
            if done > 0:
                out[worker_id] = done
        return out

    def __len__(self) -> int:
        return len(self._worker_of)


_NEVER = float("-inf")


def _computed(
    pending: Iterable[tuple[int, float]], free_at: float, overhead: float, rate: float, now: float
) -> float:
    """Tokens of ``pending`` (``(tokens, sent at)`` in the order sent) estimated computed by ``now`` on a worker free
    from ``free_at``, on the line ``overhead + tokens / rate`` (the module's docstring)."""
    computed = 0.0
    for tokens, sent_at in pending:
        began = sent_at if sent_at > free_at else free_at
        start = began + overhead
        if now <= start:
            break
        done = (now - start) * rate / tokens  # the line's fraction done
        computed += tokens * (done if done <= 0.5 else 1.0 - 0.25 / done)
        if done < 1.0:
            break
        free_at = start + tokens / rate
    return computed
