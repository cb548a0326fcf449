"""Prometheus text exposition → samples, via prometheus-client's own parser.

vLLM and LMCache expose counters with and without the `_total` suffix depending on version;
`counter_value` looks a name up both ways so callers need not care.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

from kvops.parse._common import capped_text


@dataclass(frozen=True)
class Sample:
    name: str
    labels: Mapping[str, str]
    value: float


@dataclass
class PrometheusText:
    samples: list[Sample] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    def find(self, name: str, **labels: str) -> list[Sample]:
        """Samples named `name` (or `name_total`) whose labels include `labels`."""
        names = {name, f"{name}_total"} if not name.endswith("_total") else {name, name[:-6]}
        return [
            s
            for s in self.samples
            if s.name in names and all(s.labels.get(k) == v for k, v in labels.items())
        ]

    def counter_value(self, name: str, **labels: str) -> float | None:
        """Sum of the matching samples, or None when the metric is absent (never 0 for absent)."""
        found = self.find(name, **labels)
        return sum(s.value for s in found) if found else None

    def has_prefix(self, prefix: str) -> bool:
        return any(s.name.startswith(prefix) for s in self.samples)


def parse_prometheus_text(text: str) -> PrometheusText:
    """Parse exposition text. A malformed line stops prometheus-client's parser, so on failure
    each line is tried on its own: the good ones are kept and each bad one becomes a warning,
    and truncated output still yields what can be read."""
    result = PrometheusText()
    text = capped_text(text)
    try:
        families = list(text_string_to_metric_families(text))
    except (ValueError, TypeError, IndexError):
        good: list[str] = []
        for number, line in enumerate(text.splitlines(), start=1):
            try:
                list(text_string_to_metric_families(line + "\n"))
            except (ValueError, TypeError, IndexError) as exc:
                result.warnings.append(f"line {number}: unparseable metric line skipped ({exc})")
                continue
            good.append(line)
        families = list(text_string_to_metric_families("\n".join(good) + "\n"))
    for family in families:
        for s in family.samples:
            result.samples.append(Sample(s.name, dict(s.labels), float(s.value)))
    return result
