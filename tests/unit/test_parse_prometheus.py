"""Prometheus text as vLLM and LMCache expose it."""

from __future__ import annotations

from kvops.parse.prometheus import parse_prometheus_text

VLLM_TEXT = """\
# HELP vllm:prefix_cache_hits_total Prefix cache hits, in terms of number of cached tokens.
# TYPE vllm:prefix_cache_hits_total counter
vllm:prefix_cache_hits_total{engine="0",model_name="tiny"} 1920.0
# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.1",model_name="tiny"} 3.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf",model_name="tiny"} 4.0
vllm:time_to_first_token_seconds_count{engine="0",model_name="tiny"} 4.0
vllm:time_to_first_token_seconds_sum{engine="0",model_name="tiny"} 0.62
"""


def test_counter_found_with_or_without_total_suffix() -> None:
    parsed = parse_prometheus_text(VLLM_TEXT)
    assert parsed.counter_value("vllm:prefix_cache_hits") == 1920.0
    assert parsed.counter_value("vllm:prefix_cache_hits_total", model_name="tiny") == 1920.0
    assert parsed.counter_value("vllm:time_to_first_token_seconds_sum") == 0.62
    assert parsed.warnings == []


def test_absent_metric_is_none_not_zero() -> None:
    assert parse_prometheus_text(VLLM_TEXT).counter_value("lmcache:num_stored_tokens") is None


def test_bad_line_is_a_warning_and_the_rest_is_kept() -> None:
    parsed = parse_prometheus_text(VLLM_TEXT + "vllm:num_requests_running{engine=\n")
    assert parsed.counter_value("vllm:prefix_cache_hits") == 1920.0
    assert len(parsed.warnings) == 1
    assert "line 10" in parsed.warnings[0]
