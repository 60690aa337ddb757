"""A simulated vLLM worker for tests and benchmarks: the HTTP surface, metrics, NIXL prefill/decode protocol and KV
events of a real worker, with a paged KV cache, continuous batching and a timing model instead of a GPU.
See README.md in this package for the reading order.
"""

from litellm_disagg.sim.cluster import SimCluster
from litellm_disagg.sim.engine import SimEngine
from litellm_disagg.sim.settings import EngineSettings, SimSettings, TimingSettings
from litellm_disagg.sim.timing import StepWork, TimingModel
from litellm_disagg.sim.worker import SimWorker, SimWorkerState

__all__ = [
    "EngineSettings",
    "SimCluster",
    "SimEngine",
    "SimSettings",
    "SimWorker",
    "SimWorkerState",
    "StepWork",
    "TimingModel",
    "TimingSettings",
]
