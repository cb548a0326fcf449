"""`/metrics` for the simulated server: vLLM's and LMCache's metric names, one registry per server.

Counters and gauges are read from the engine at scrape time (a custom collector), so they can
never drift from the model's state; latency histograms are observed as requests finish, in real
(wall) seconds, as the client sees them. LMCache metrics appear only when the LMCache connector is
on, as on a real vLLM + LMCache server.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from kvops.sim.model import Engine
from kvops.sim.records import SimRequestRecord

_TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5,
                 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)  # fmt: skip
_ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0,
                7.5, 10.0, 20.0, 40.0, 80.0)  # fmt: skip
_E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0,
                60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)  # fmt: skip

_LAG_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
EMISSION_LAG = "kvops:sim_emission_lag_seconds"
ARRIVAL_WAIT = "kvops:sim_arrival_wait_seconds"


class _EngineCollector(Collector):
    def __init__(self, engine: Engine, model_name: str, cache_info: dict[str, str]) -> None:
        self.engine = engine
        self.labels = {"model_name": model_name, "engine": "0"}
        self.cache_info = cache_info

    def _counter(self, name: str, doc: str, value: float) -> CounterMetricFamily:
        family = CounterMetricFamily(name, doc, labels=list(self.labels))
        family.add_metric(list(self.labels.values()), value)
        return family

    def _gauge(
        self, name: str, doc: str, value: float, labels: dict[str, str]
    ) -> GaugeMetricFamily:
        family = GaugeMetricFamily(name, doc, labels=list(labels))
        family.add_metric(list(labels.values()), value)
        return family

    def collect(self) -> Iterator[Metric]:
        e, st = self.engine, self.engine.stats
        yield self._gauge("vllm:num_requests_running", "Requests in model execution batches.",
                          e.num_running(), self.labels)  # fmt: skip
        yield self._gauge("vllm:num_requests_waiting", "Requests waiting to be processed.",
                          e.num_waiting(), self.labels)  # fmt: skip
        yield self._gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.",
                          e.cache.usage(), self.labels)  # fmt: skip
        counters = [
            ("vllm:prefix_cache_queries", "Prefix cache queries, in terms of number of queried "
             "tokens.", st.prefix_cache_queries),
            ("vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.",
             st.prefix_cache_hits),
            ("vllm:num_preemptions", "Cumulative number of preemption from the engine.",
             st.num_preemptions),
            ("vllm:prompt_tokens", "Number of prefill tokens processed.", st.prompt_tokens),
            ("vllm:generation_tokens", "Number of generation tokens processed.",
             st.generation_tokens),
            ("vllm:request_success", "Count of successfully processed requests.",
             st.request_success),
        ]  # fmt: skip
        if e.offload is not None:
            counters += [
                ("vllm:external_prefix_cache_queries", "External prefix cache queries from KV "
                 "connector cross-instance cache sharing, in terms of number of queried tokens.",
                 st.external_prefix_cache_queries),
                ("vllm:external_prefix_cache_hits", "External prefix cache hits from KV "
                 "connector cross-instance cache sharing, in terms of number of cached tokens.",
                 st.external_prefix_cache_hits),
            ]  # fmt: skip
        for name, doc, value in counters:
            yield self._counter(name, doc, value)
        cached = CounterMetricFamily("vllm:prompt_tokens_cached_by_source",
                                     "Cached prompt tokens by source.",
                                     labels=[*self.labels, "source"])  # fmt: skip
        cached.add_metric([*self.labels.values(), "device"], st.prefix_cache_hits)
        cached.add_metric([*self.labels.values(), "external_unspecified"],
                          st.external_prefix_cache_hits)  # fmt: skip
        yield cached
        yield self._counter("vllm:prompt_tokens_cached", "Cached prompt tokens.",
                            st.prefix_cache_hits + st.external_prefix_cache_hits)  # fmt: skip
        yield self._gauge("vllm:cache_config_info", "Information of the LLMEngine CacheConfig",
                          1.0, self.cache_info)  # fmt: skip
        if e.offload is not None:
            yield from self._lmcache()

    def _lmcache(self) -> Iterator[Metric]:
        assert self.engine.offload is not None
        off = self.engine.offload
        s = off.stats
        labels = {"model_name": self.labels["model_name"], "worker_id": "0", "role": "worker"}

        def counter(name: str, doc: str, value: float) -> CounterMetricFamily:
            family = CounterMetricFamily(name, doc, labels=list(labels))
            family.add_metric(list(labels.values()), value)
            return family

        st = self.engine.stats
        yield counter("lmcache:num_retrieve_requests", "Retrieve requests", s.retrieve_requests)
        yield counter("lmcache:num_store_requests", "Store requests", s.store_requests)
        yield counter("lmcache:num_lookup_requests", "Lookup requests", s.lookup_requests)
        yield counter("lmcache:num_requested_tokens", "Tokens requested", s.requested_tokens)
        yield counter("lmcache:num_hit_tokens", "Tokens hit in LMCache", s.hit_tokens)
        yield counter("lmcache:num_stored_tokens", "Tokens stored", s.stored_tokens)
        yield counter("lmcache:num_lookup_tokens", "Tokens looked up", s.lookup_tokens)
        yield counter("lmcache:num_lookup_hits", "Lookup hit tokens", s.lookup_hit_tokens)
        yield counter("lmcache:num_vllm_hit_tokens", "vLLM hit tokens", st.prefix_cache_hits)
        yield counter("lmcache:num_prompt_tokens", "Prompt tokens", st.prompt_tokens)
        yield counter("lmcache:local_cpu_evict_count", "Evictions", s.evictions)
        retrieve_rate = s.hit_tokens / s.requested_tokens if s.requested_tokens else 0.0
        lookup_rate = s.lookup_hit_tokens / s.lookup_tokens if s.lookup_tokens else 0.0
        for name, value in (
            ("lmcache:retrieve_hit_rate", retrieve_rate),
            ("lmcache:lookup_hit_rate", lookup_rate),
            ("lmcache:local_cache_usage", off.usage_bytes("local_cpu")),
            ("lmcache:local_storage_usage", off.usage_bytes("gds") + off.usage_bytes("local_disk")),
            ("lmcache:lmcache_is_healthy", 1.0),
        ):
            yield self._gauge(name, name.split(":", 1)[1].replace("_", " "), value, labels)


class ServerMetrics:
    """The per-server registry: engine collector plus request latency histograms."""

    def __init__(self, engine: Engine, model_name: str, cache_info: dict[str, str]) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.registry.register(_EngineCollector(engine, model_name, cache_info))
        labels = ["model_name", "engine"]
        self._values = [model_name, "0"]
        self.ttft = Histogram("vllm:time_to_first_token_seconds", "Histogram of time to first "
                              "token in seconds.", labels, registry=self.registry,
                              buckets=_TTFT_BUCKETS)  # fmt: skip
        self.itl = Histogram("vllm:inter_token_latency_seconds", "Histogram of inter-token "
                             "latency in seconds.", labels, registry=self.registry,
                             buckets=_ITL_BUCKETS)  # fmt: skip
        self.e2e = Histogram("vllm:e2e_request_latency_seconds", "Histogram of e2e request "
                             "latency in seconds.", labels, registry=self.registry,
                             buckets=_E2E_BUCKETS)  # fmt: skip

        # kvops-only: how late (wall seconds) each step's tokens left against the model's
        # schedule. Zero-ish means the client measured the model; large means it measured
        # this host's CPU (the model's clock is never stretched, so lateness only adds).
        self.emission_lag = Histogram(EMISSION_LAG, "Wall seconds by which a step's tokens "
                                      "were sent after the model scheduled them.", labels,
                                      registry=self.registry, buckets=_LAG_BUCKETS)  # fmt: skip

        # kvops-only: the steps the engine held for requests that had arrived (their handler
        # started) but were still being read, one observation per held step. A slow upload
        # may hold one step, by at most the server's cap: more than one per slow request, or
        # a long one, means one client's upload stalled everyone's tokens.
        self.arrival_wait = Histogram(ARRIVAL_WAIT, "Wall seconds a step was held for requests "
                                      "still being read.", labels, registry=self.registry,
                                      buckets=_LAG_BUCKETS)  # fmt: skip

        self.emission_lag.labels(*self._values)  # present from the start: a reader diffs it
        self.arrival_wait.labels(*self._values)

    def observe_lag(self, lag_s: float) -> None:
        self.emission_lag.labels(*self._values).observe(max(0.0, lag_s))

    def observe_arrival_wait(self, wait_s: float) -> None:
        self.arrival_wait.labels(*self._values).observe(max(0.0, wait_s))

    def observe(self, record: SimRequestRecord, time_scale: float) -> None:
        """Record a finished request's latencies in real seconds (virtual x time_scale)."""
        if record.first_token_s is None or record.finish_s is None:
            return
        self.ttft.labels(*self._values).observe(
            (record.first_token_s - record.arrival_s) * time_scale
        )
        itl = self.itl.labels(*self._values)
        times = record.token_times_s
        for a, b in itertools.pairwise(times):
            itl.observe((b - a) * time_scale)
        self.e2e.labels(*self._values).observe((record.finish_s - record.arrival_s) * time_scale)
