"""The timing model: how long one engine step and one KV transfer take, in simulated seconds. Pure functions.

One step is one forward pass over the running batch. It reads all the weights once (the memory-bound floor, which is
also the step time of a lone decoding sequence), computes the prefill tokens of the step at the compute-bound rate,
and pays a small extra cost per decoding sequence (its KV reads)::

    step_time = max(weight_read_s, prefill_tokens / prefill_tokens_per_s) + decode_seqs * per_seq_s

``weight_read_s`` and ``per_seq_s`` follow from two published figures: the decode rate of one sequence
(``1 / (weight_read_s + per_seq_s)``) and the aggregate rate at a reference batch
(``B / (weight_read_s + B * per_seq_s)``). Tokens served from the prefix cache are not computed, so they cost nothing.
A KV transfer costs a fixed latency plus its bytes over the link bandwidth.
"""

from __future__ import annotations

from dataclasses import dataclass

from litellm_disagg.sim.settings import TimingSettings


@dataclass(frozen=True)
class StepWork:
    """What one step computes."""

    prefill_tokens: int = 0
    """Prompt (or recomputed) tokens whose KV this step computes, over all sequences."""
    decode_seqs: int = 0
    """Sequences that compute exactly one new token this step."""

    @property
    def empty(self) -> bool:
        return self.prefill_tokens == 0 and self.decode_seqs == 0


class TimingModel:
    def __init__(self, settings: TimingSettings):
        self.settings = settings
        one = 1.0 / settings.decode_tokens_per_s_batch1
        batch = settings.decode_ref_batch
        at_batch = batch / settings.decode_tokens_per_s_at_ref_batch
        self.per_seq_s = (at_batch - one) / (batch - 1)
        self.weight_read_s = one - self.per_seq_s

    @property
    def speedup(self) -> float:
        return self.settings.speedup

    def step_time(self, work: StepWork) -> float:
        if work.empty:
            return 0.0
        compute = max(self.weight_read_s, work.prefill_tokens / self.settings.prefill_tokens_per_s)
        return compute + work.decode_seqs * self.per_seq_s

    def decode_tokens_per_s(self, batch: int) -> float:
        """Aggregate decode rate of ``batch`` sequences decoding together (no prefill in the steps)."""
        return batch / self.step_time(StepWork(decode_seqs=batch))

    def transfer_time(self, num_tokens: int) -> float:
        if num_tokens <= 0:
            return 0.0
        return (
            self.settings.kv_transfer_latency_s
            + num_tokens * self.settings.kv_bytes_per_token / self.settings.kv_transfer_bytes_per_s
        )

    def transfer_bytes(self, num_tokens: int) -> int:
        return max(num_tokens, 0) * self.settings.kv_bytes_per_token

    def wall(self, simulated_s: float) -> float:
        """The wall-clock time the engine sleeps for ``simulated_s``."""
        return simulated_s / self.settings.speedup
