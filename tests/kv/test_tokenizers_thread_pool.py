"""The ``tokenizers`` thread pool is off in the proxy unless asked for (``TokenizerSettings.thread_pool``): its
threads spin after each batch and took the CPU from the event loop (docs/benchmarks.md, the second turn)."""

import os
import subprocess
import sys

from litellm_disagg.routing.kv.settings import TokenizerSettings
from litellm_disagg.routing.kv.tokenizer import PARALLELISM_ENV, PromptTokenizer


def test_the_router_turns_the_pool_off_when_the_environment_says_nothing(monkeypatch):
    monkeypatch.delenv(PARALLELISM_ENV, raising=False)
    PromptTokenizer(TokenizerSettings())
    assert os.environ[PARALLELISM_ENV] == "false"


def test_an_operators_setting_is_left_as_it_is(monkeypatch):
    monkeypatch.setenv(PARALLELISM_ENV, "true")
    PromptTokenizer(TokenizerSettings())
    assert os.environ[PARALLELISM_ENV] == "true"


def test_thread_pool_true_leaves_the_librarys_default(monkeypatch):
    monkeypatch.delenv(PARALLELISM_ENV, raising=False)
    PromptTokenizer(TokenizerSettings(thread_pool=True))
    assert PARALLELISM_ENV not in os.environ


_THREADS_AFTER_A_BATCH = """
import os, sys
from tokenizers import Tokenizer, models, pre_tokenizers
from litellm_disagg.routing.kv.settings import TokenizerSettings
from litellm_disagg.routing.kv.tokenizer import PromptTokenizer

PromptTokenizer(TokenizerSettings(thread_pool=sys.argv[1] == "on"))
tok = Tokenizer(models.WordLevel({"a": 0, "[UNK]": 1}, unk_token="[UNK]"))
tok.pre_tokenizer = pre_tokenizers.Whitespace()
before = len(os.listdir("/proc/self/task"))
tok.encode_batch(["a b a " * 50] * 64)
print(before, len(os.listdir("/proc/self/task")))
"""


def _threads(pool: str) -> tuple[int, int]:
    env = {k: v for k, v in os.environ.items() if k != PARALLELISM_ENV}
    out = subprocess.run([sys.executable, "-c", _THREADS_AFTER_A_BATCH, pool], env=env, capture_output=True,
                         text=True, timeout=120, check=True)
    before, after = out.stdout.split()
    return int(before), int(after)


def test_the_library_then_encodes_a_batch_without_starting_its_pool():
    before, after = _threads("off")
    assert after == before  # no pool threads: the batch was encoded in the calling thread
    before, after = _threads("on")
    assert after > before  # the library's default: its pool started for the batch
