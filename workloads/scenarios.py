"""Named workloads, each set against the profile it runs on (:func:`profile_for`).

The four TWP scenarios run on the default profile, ``a100-llama3-8b``. With the TWP paper's length mix (mean
prompt 245, mean output 65 tokens) and the default engine (``max_num_seqs=128``), FCFS there keeps its backlog
near zero up to about 35 requests/s and serves at most about 36 requests/s when overloaded (measured by
``python benchmarks/capacity.py``). The scenarios sit below, near, above and in bursts over that capacity.
Scenarios where KV memory binds run on ``a40-llama2-7b`` (53k KV tokens). The prefix-caching scenarios (the
Mooncake traces and ``shared-prefix``) are pinned to ``a100-llama3-8b``: reuse needs a large KV cache.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import lru_cache

import numpy as np

from servegym.workloads.arrivals import Gamma, MarkovModulated, Poisson
from servegym.workloads.base import Workload
from servegym.workloads.lengths import Choice, PairedEmpirical, RangeMix
from servegym.workloads.mooncake import MooncakeWorkload
from servegym.workloads.sessions import SessionWorkload
from servegym.workloads.synthetic import SyntheticWorkload
from servegym.workloads.trace import TraceWorkload, bundled_trace

TWP_PROMPTS = Choice((50, 200, 800), (0.5, 0.3, 0.2))
"""The TWP paper's prompt mix."""
TWP_OUTPUTS = Choice((20, 50, 200), (0.5, 0.3, 0.2))
"""The TWP paper's output mix (mean 65 tokens)."""
GSM8K_SHAPED_PROMPTS = RangeMix(((30, 80), (120, 250), (350, 512)), (0.6, 0.3, 0.1))
"""The TWP paper's GSM8K-shaped prompt lengths."""

CAPACITY_RPS = 35.0
"""FCFS capacity of the default profile on the TWP length mix (see the module docstring)."""
SCENARIO_RATES = {"low": 16.0, "medium": 32.0, "high": 47.0}
"""Poisson rates (requests/s): about 0.45x, 0.9x and 1.35x :data:`CAPACITY_RPS`."""
BURST = MarkovModulated(base_rate=13.0, burst_rate=90.0, calm_s=10.0, burst_s=3.0)
"""Calm at 13 req/s, bursts of 90 req/s (2.5x capacity) lasting 3 s on average; mean 31 req/s (0.89x)."""
DURATION_S = 60.0
TIGHT_PROFILE = "a40-llama2-7b"
"""The smaller GPU of the memory-bound scenarios: 53,136 KV tokens (512 KiB per token for Llama-2-7B)."""
LONG_PROMPTS = RangeMix(((100, 400), (400, 1200)), (0.5, 0.5))
LONG_OUTPUTS = RangeMix(((100, 400), (400, 1500)), (0.6, 0.4))
"""Long outputs (mean about 550 tokens): a request's KV grows for hundreds of steps after admission."""


def _twp(rate_or_process, prompts=TWP_PROMPTS) -> SyntheticWorkload:
    arrivals = Poisson(rate_or_process) if isinstance(rate_or_process, float) else rate_or_process
    return SyntheticWorkload(arrivals, DURATION_S, prompt=prompts, output=TWP_OUTPUTS)


@lru_cache(maxsize=1)
def gsm8k_pairs(tokens_per_word: float = 1.0) -> PairedEmpirical:
    """(question, answer) lengths from the bundled GSM8K counts, one word = ``tokens_per_word`` tokens."""
    path = bundled_trace("gsm8k_lengths.csv")
    data = np.genfromtxt(path, delimiter=",", skip_header=1, usecols=(1, 2), dtype=np.int64)
    prompts = np.maximum(1, np.round(data[:, 0] * tokens_per_word)).astype(int)
    outputs = np.maximum(1, np.round(data[:, 1] * tokens_per_word)).astype(int)
    return PairedEmpirical(tuple(prompts.tolist()), tuple(outputs.tolist()))


@lru_cache(maxsize=1)
def azure_conv_pairs() -> PairedEmpirical:
    """(prompt, output) token counts of the 19,366 requests of the Azure LLM inference trace 2023's conversation
    service (the bundled ``azure_llm_2023_conv.csv``, as Vidur ships it): a public chat trace, resampled jointly."""
    data = np.genfromtxt(bundled_trace("azure_llm_2023_conv.csv"), delimiter=",", skip_header=1, usecols=(1, 2),
                         dtype=np.int64)
    return PairedEmpirical(tuple(data[:, 0].tolist()), tuple(data[:, 1].tolist()))


PAIRED_LENGTHS: dict[str, Callable[[], PairedEmpirical]] = {"gsm8k": gsm8k_pairs, "azure-conv": azure_conv_pairs}
"""Length sets an experiment's workload may draw (prompt, output) pairs from (``lengths: NAME``)."""


TEST_SPANS = ((0.35, 0.65),)
TRAIN_SPANS = ((0.0, 0.35), (0.65, 1.0))
"""Trace tasks test on windows inside the middle 35-65% of the trace's time range and train and validate on windows
inside the rest, so no test request appears in any training or validation window. The held-out part is the middle,
not the end, because the bundled trace is busier in its first two thirds: a held-out tail would test on lighter
load (376 requests per 120 s in the middle, 272 outside it, 148 in the last 30%). These are Serving-v1's splits."""
V2_TEST_SPANS = ((0.325, 0.675),)
V2_TRAIN_SPANS = ((0.0, 0.325), (0.675, 1.0))
"""Serving-v2's splits: the held-out middle grows to 35% of each trace so that it holds 10 disjoint test tiles of a
task's window (:attr:`TraceWorkload.tiles`): 1,203 s of the Azure code trace, ten 120 s tiles; 1,238 s of the
Mooncake conversation trace, two 600 s time tiles times 5 shards, or ten 120 s cluster tiles. v1's random windows in
the 30% middle overlapped: their 30 test episodes held only 3,226 distinct requests in 11,173 rows (long-context),
2,853 in 10,637 (prefix-reuse) and 2,999 in 26,511 (cluster-routing)."""

PREFIX_PROFILE = "a100-llama3-8b"
"""The profile of the prefix-caching scenarios: its large KV cache (28k blocks of 16 tokens) holds shared prefixes."""
MOONCAKE_SHARDS = 5
"""A Mooncake window keeps the sessions of one replica in 5 (session id mod 5, drawn per episode), at the trace's
own pace: one GPU's share of a cluster that routes by session, every turn of its sessions included. The whole
trace (3.4 requests/s of 12k-token prompts, 41k prompt tokens/s) would swamp one A100; a fifth of it loads the
A100 profile near its KV cache's limit. Measured with FCFS and prefix caching, 4 seeds per side: training windows
hold 357-390 requests, use 0.40-0.89 of the cache on average and have e2e means of 33-270 s; test windows (the
trace's quieter middle) hold 316-352 requests, use 0.38-0.66 and have e2e means of 29-88 s. Stretching time
instead (a 4x slower replay) would keep too little of a session in a window: its turns come minutes apart, and a
30-s slice of the trace reuses 5% of its prompt tokens against 37% over the hour."""
MOONCAKE_TIME_SCALE = 1.0
"""Mooncake windows replay at the trace's own pace (sharding, not stretching, sets the load)."""
MOONCAKE_WINDOW_S = 600.0
"""Length of a Mooncake window: ten minutes, long enough for sessions to come back (the trace-only hit ratio of a
600-s, one-in-5 training window is about 0.28)."""
MOONCAKE_MIN_REQUESTS = 20
"""Mooncake windows keeping fewer requests (of sessions starting in the window's spans) are redrawn."""
CLUSTER_WINDOW_S = 300.0
"""Length of a cluster window in Serving-v1: every session of the Mooncake conversation trace (no sharding, about
1,000 requests in five minutes) for a cluster of replicas to route."""
V2_CLUSTER_WINDOW_S = 120.0
"""Length of a cluster window in Serving-v2 (training and test alike): about 400 requests. The 1,238 s held-out span
holds ten disjoint 120 s tiles but only four of 300 s; the price is less reuse within a window (the trace-only hit
ratio of a 120 s window of the whole trace is about 0.11, of a 300 s one about 0.19)."""
SHARED_PREFIX_SESSION_RATE = 2.0
"""``shared-prefix``: sessions started per second (about 5 requests/s at 2.5 turns). Provisional."""
SHARED_PREFIX_DURATION_S = 60.0
"""``shared-prefix``: seconds over which sessions start."""


def _mooncake(trace: str, spans: tuple[tuple[float, float], ...] = ((0.0, 1.0),), shards: int = MOONCAKE_SHARDS,
              window_s: float = MOONCAKE_WINDOW_S, tiles: bool = False) -> MooncakeWorkload:
    return MooncakeWorkload(trace, time_scale=MOONCAKE_TIME_SCALE, duration_s=window_s, random_window=True,
                            min_requests=MOONCAKE_MIN_REQUESTS, spans=spans, shards=shards, tiles=tiles)


def _azure_code(spans: tuple[tuple[float, float], ...] = ((0.0, 1.0),), tiles: bool = False) -> TraceWorkload:
    """The long-context task's 120 s windows of the Azure code trace (under 100 requests: redrawn, or for a tile an
    error)."""
    return TraceWorkload(str(bundled_trace()), duration_s=120.0, random_window=True, min_requests=100, spans=spans,
                         tiles=tiles)


def _shared_prefix() -> SessionWorkload:
    return SessionWorkload(SHARED_PREFIX_SESSION_RATE, SHARED_PREFIX_DURATION_S, num_system_prompts=4,
                           system_prompt_tokens=RangeMix(((1000, 2000),), (1.0,)),
                           turns=Choice((1, 2, 3, 4), (0.25, 0.25, 0.25, 0.25)),
                           user_tokens=RangeMix(((20, 400),), (1.0,)), output=RangeMix(((20, 400),), (1.0,)),
                           think_s=5.0, block_tokens=16)


WORKLOADS: dict[str, tuple[Callable[[], Workload], str]] = {
    "low": (
        lambda: _twp(SCENARIO_RATES["low"]),
        f"TWP length mix, Poisson {SCENARIO_RATES['low']:g} req/s for 60 s (0.45x capacity)",
    ),
    "medium": (
        lambda: _twp(SCENARIO_RATES["medium"]),
        f"TWP length mix, Poisson {SCENARIO_RATES['medium']:g} req/s for 60 s (0.9x capacity)",
    ),
    "high": (
        lambda: _twp(SCENARIO_RATES["high"]),
        f"TWP length mix, Poisson {SCENARIO_RATES['high']:g} req/s for 60 s (1.35x capacity)",
    ),
    "burst": (
        lambda: _twp(BURST),
        f"TWP length mix, MMPP-2: {BURST.base_rate:g} req/s calm (10 s), {BURST.burst_rate:g} req/s bursts (3 s), 60 s",
    ),
    "twp-gsm8k": (
        lambda: _twp(SCENARIO_RATES["medium"], GSM8K_SHAPED_PROMPTS),
        f"GSM8K-shaped prompts (60% 30-80, 30% 120-250, 10% 350-512), TWP outputs, Poisson "
        f"{SCENARIO_RATES['medium']:g} req/s",
    ),
    "gsm8k": (
        lambda: SyntheticWorkload(Poisson(SCENARIO_RATES["medium"]), DURATION_S, paired=gsm8k_pairs()),
        f"GSM8K question/answer word counts as token lengths, Poisson {SCENARIO_RATES['medium']:g} req/s for 60 s",
    ),
    "gamma-bursty": (
        lambda: _twp(Gamma(SCENARIO_RATES["medium"], cv=3.0)),
        f"TWP length mix, gamma renewal arrivals at {SCENARIO_RATES['medium']:g} req/s with inter-arrival CV 3",
    ),
    "cpu-fidelity": (
        lambda: SyntheticWorkload(Poisson(6.0), 20.0, prompt=Choice((32, 128, 256), (0.5, 0.3, 0.2)),
                                  output=Choice((16, 64, 128), (0.5, 0.3, 0.2))),
        "short prompts/outputs, Poisson 6 req/s for 20 s: about the capacity of the CPU profile's first machine "
        "(a 2x slower one runs it 2x overloaded), a few minutes of CPU",
    ),
    "azure-code": (
        lambda: TraceWorkload(str(bundled_trace()), duration_s=120.0),
        "Azure LLM code trace 2023 (CC-BY-4.0), first 120 s replayed in real time (long prompts, mean 2k tokens)",
    ),
    "azure-code-2x": (
        lambda: TraceWorkload(str(bundled_trace()), time_scale=0.5, duration_s=60.0),
        "the Azure code trace at twice its rate (time compressed 2x), the first 120 s of the trace in 60 s",
    ),
    "azure-code-window": (
        _azure_code,
        "a random 120 s window of the Azure code trace (drawn per episode; windows with under 100 requests are "
        "redrawn), replayed in real time",
    ),
    "azure-code-window-train": (
        lambda: _azure_code(TRAIN_SPANS),
        "a random 120 s window of the Azure code trace outside its held-out middle 35-65% (Serving-v1's "
        "long-context training and validation episodes)",
    ),
    "azure-code-window-test": (
        lambda: _azure_code(TEST_SPANS),
        "a random 120 s window of the held-out middle 35-65% of the Azure code trace (Serving-v1's long-context "
        "test episodes)",
    ),
    "azure-code-window-train-v2": (
        lambda: _azure_code(V2_TRAIN_SPANS),
        "a random 120 s window of the Azure code trace outside its held-out middle 35% (32.5-67.5%; the "
        "long-context task's training and validation episodes)",
    ),
    "azure-code-tiles-test": (
        lambda: _azure_code(V2_TEST_SPANS, tiles=True),
        "one of ten back-to-back 120 s tiles of the held-out middle 35% of the Azure code trace, seed mod 10 (the "
        "long-context task's test episodes: no request in two)",
    ),
    "long-output": (
        lambda: SyntheticWorkload(Poisson(3.0), DURATION_S, prompt=LONG_PROMPTS, output=LONG_OUTPUTS),
        "long outputs (100-1500 tokens, mean ~550) and prompts (100-1200), Poisson 3 req/s on the A40 (KV-bound)",
    ),
    "tight-memory": (
        lambda: _twp(7.0, RangeMix(((200, 800), (800, 2000)), (0.6, 0.4))),
        "TWP outputs with 200-2000-token prompts, Poisson 7 req/s on the A40's 53k KV tokens (preempts under FCFS)",
    ),
    "mooncake-conversation": (
        lambda: _mooncake("conversation", TRAIN_SPANS),
        f"a random {MOONCAKE_WINDOW_S:g} s window of the Mooncake conversation trace (Apache-2.0; prefix chains, "
        f"mean prompt 12k tokens), one replica's sessions in {MOONCAKE_SHARDS}, outside its held-out middle 35-65% "
        "(sessions starting there are held out)",
    ),
    "mooncake-conversation-test": (
        lambda: _mooncake("conversation", TEST_SPANS),
        f"a random {MOONCAKE_WINDOW_S:g} s window of the held-out middle 35-65% of the Mooncake conversation trace, "
        f"one replica's sessions in {MOONCAKE_SHARDS}, only sessions that start there (Serving-v1's prefix-reuse "
        "test episodes)",
    ),
    "mooncake-conversation-v2": (
        lambda: _mooncake("conversation", V2_TRAIN_SPANS),
        f"a random {MOONCAKE_WINDOW_S:g} s window of the Mooncake conversation trace, one replica's sessions in "
        f"{MOONCAKE_SHARDS}, outside its held-out middle 35% (32.5-67.5%; the prefix-reuse task's training and "
        "validation episodes)",
    ),
    "mooncake-conversation-tiles-test": (
        lambda: _mooncake("conversation", V2_TEST_SPANS, tiles=True),
        f"one of ten tiles of the held-out middle 35% of the Mooncake conversation trace: two back-to-back "
        f"{MOONCAKE_WINDOW_S:g} s windows times {MOONCAKE_SHARDS} shards of its sessions, only sessions that start "
        "there, seed mod 10 (the prefix-reuse task's test episodes: no request in two)",
    ),
    "mooncake-cluster": (
        lambda: _mooncake("conversation", TRAIN_SPANS, shards=1, window_s=CLUSTER_WINDOW_S),
        f"a random {CLUSTER_WINDOW_S:g} s window of the whole Mooncake conversation trace at its own rate (3.4 req/s, "
        "41k prompt tokens/s: a cluster's load), outside its held-out middle 35-65%",
    ),
    "mooncake-cluster-test": (
        lambda: _mooncake("conversation", TEST_SPANS, shards=1, window_s=CLUSTER_WINDOW_S),
        f"a random {CLUSTER_WINDOW_S:g} s window of the held-out middle 35-65% of the whole Mooncake conversation "
        "trace, only sessions that start there (Serving-v1's cluster-routing test episodes)",
    ),
    "mooncake-cluster-v2": (
        lambda: _mooncake("conversation", V2_TRAIN_SPANS, shards=1, window_s=V2_CLUSTER_WINDOW_S),
        f"a random {V2_CLUSTER_WINDOW_S:g} s window of the whole Mooncake conversation trace at its own rate, outside "
        "its held-out middle 35% (32.5-67.5%; the cluster-routing task's training and validation episodes)",
    ),
    "mooncake-cluster-tiles-test": (
        lambda: _mooncake("conversation", V2_TEST_SPANS, shards=1, window_s=V2_CLUSTER_WINDOW_S, tiles=True),
        f"one of ten back-to-back {V2_CLUSTER_WINDOW_S:g} s tiles of the held-out middle 35% of the whole Mooncake "
        "conversation trace, only sessions that start there, seed mod 10 (the cluster-routing task's test "
        "episodes: no request in two)",
    ),
    "mooncake-synthetic": (
        lambda: _mooncake("synthetic"),
        f"a random {MOONCAKE_WINDOW_S:g} s window of the Mooncake synthetic trace (Apache-2.0; multi-turn prefix "
        f"chains, mean prompt 15k tokens), one replica's sessions in {MOONCAKE_SHARDS}",
    ),
    "shared-prefix": (
        _shared_prefix,
        f"chat sessions at {SHARED_PREFIX_SESSION_RATE:g}/s for {SHARED_PREFIX_DURATION_S:g} s over 4 shared system "
        "prompts of 1,000-2,000 tokens, 1-4 turns of 20-400 user and output tokens, 5 s think time",
    ),
}


SCENARIO_PROFILES = {"long-output": TIGHT_PROFILE, "tight-memory": TIGHT_PROFILE, "cpu-fidelity": "cpu-small-llama",
                     **dict.fromkeys(("mooncake-conversation", "mooncake-conversation-test", "mooncake-conversation-v2",
                                      "mooncake-conversation-tiles-test", "mooncake-cluster", "mooncake-cluster-test",
                                      "mooncake-cluster-v2", "mooncake-cluster-tiles-test", "mooncake-synthetic",
                                      "shared-prefix"), PREFIX_PROFILE)}
"""Scenarios set against a named profile (the rest run on the default): the memory-bound ones on the small A40, the
prefix-caching ones pinned to the large A100 cache whatever the default becomes."""


def profile_for(workload: object) -> str:
    """The profile a named scenario is set against (the default for the others and for workload objects)."""
    from servegym.backends import DEFAULT_PROFILE

    return SCENARIO_PROFILES.get(workload, DEFAULT_PROFILE) if isinstance(workload, str) else DEFAULT_PROFILE


def make_workload(name: str) -> Workload:
    """Build a named workload (see :data:`WORKLOADS`)."""
    try:
        factory, _ = WORKLOADS[name]
    except KeyError:
        raise ValueError(f"unknown workload {name!r}; known: {sorted(WORKLOADS)}") from None
    return factory()
