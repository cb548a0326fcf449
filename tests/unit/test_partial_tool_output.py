"""Partial or older nvidia-fs stats and gdsio output, cut from the real fixtures: the parsers
keep what was there and name what is missing (as the gdscheck parser does), and the checks that
need a missing value SKIP or WARN naming it, never FAIL on absent evidence nor PASS."""

from __future__ import annotations

from evidence_builders import command, edited, file_item, findings_for, fixture, healthy

from kvops.parse.gdsio import parse_gdsio
from kvops.parse.nvfs_stats import io_counts, missing_counters, parse_nvfs_stats

STATS = fixture("nvidia-fs/nvidia-docs-stats-gds1.0-16gpu-mib.txt")
LEGACY = fixture("nvidia-fs/nvidia-docs-stats-legacy-mb-single-write.txt")
NETAPP = fixture("gdsio/openshift-l40s-netapp-nfs-rdma.txt")
STATS_PATH = "/proc/driver/nvidia-fs/stats"


def without(text: str, *prefixes: str) -> str:
    return "".join(ln for ln in text.splitlines(keepends=True) if not ln.startswith(prefixes))


def test_stats_without_the_peerdirect_line_keep_everything_else() -> None:
    stats = parse_nvfs_stats(without(STATS, "Mellanox PeerDirect"))
    assert stats.peerdirect_supported is None
    assert stats.missing == ["Mellanox PeerDirect Supported"]
    assert stats.warnings == [
        "line 'Mellanox PeerDirect Supported' missing: older nvidia-fs or output truncated"
    ]
    assert stats.driver_version == "2.7.47" and len(stats.gpus) == 16
    assert io_counts(stats) == (0, 0)


def test_stats_without_reads_and_writes_lines_keep_the_rest() -> None:
    stats = parse_nvfs_stats(without(LEGACY, "Reads", "Writes", "pg-cache-eio"))
    assert missing_counters(stats) == ["Reads", "Writes"] and io_counts(stats) is None
    assert stats.peerdirect_supported is True and stats.gpus[0]["cross_root_port_pct"] == 100.0
    assert stats.sections["Sparse Reads"]["n"] == "0"  # "Sparse Reads" is not "Reads"
    cut = parse_nvfs_stats(STATS[: STATS.index("Writes")])  # a copy cut before Writes
    assert cut.missing == ["Writes"] and cut.reads["n"] == 0 and cut.gpus == []


def test_a_gdsio_line_cut_before_throughput_keeps_its_fields() -> None:
    cut = NETAPP[: NETAPP.rindex("Throughput")]  # the last job's line stops there
    out = parse_gdsio(cut)
    assert [r.io_type for r in out.results] == ["RANDWRITE", "RANDREAD"]
    [partial] = out.partial
    assert partial.fields == {
        "io_type": "WRITE",
        "xfer_type": "GPUD",
        "threads": 32,
        "dataset_done_kib": 320301056,
        "dataset_total_kib": 33554432,
        "io_size_kib": 1024,
    }
    assert partial.missing == ["Throughput", "Avg_Latency", "ops", "total_time"]
    assert out.warnings == [f"gdsio result cut short: {partial.describe()}"]
    assert "has no Throughput, Avg_Latency, ops, total_time" in out.warnings[0]
    assert out.to_dict()["partial"][0]["missing"][0] == "Throughput"


def test_a_result_line_wrapped_onto_the_next_line_is_joined() -> None:
    line = fixture("gdsio/gh-issue-gds-nvidia-fs-78-single-write.txt").strip()
    at = line.index("Throughput")
    out = parse_gdsio(f"{line[:at].rstrip()}\n{line[at:]}\n")
    assert out.partial == [] and out.warnings == []
    assert out.results[0].throughput_gib_s == 0.013104 and out.results[0].ops == 256


def test_peerdirect_and_version_unknown_skip_naming_the_missing_lines() -> None:
    stats = file_item(STATS_PATH, without(STATS, "Mellanox PeerDirect", "NVFS Driver"))
    doc = edited(nvfs_stats=stats, gdscheck=None, nvfs_version=None)
    [(severity, message)] = findings_for(doc, "GDS-012")
    assert severity == "SKIP"
    assert "nvfs_stats: no 'Mellanox PeerDirect Supported' line" in message
    [(severity, message)] = findings_for(doc, "GDS-011")
    assert severity == "SKIP" and "nvfs_stats: no 'NVFS Driver(version)' line" in message


def test_bench_stats_without_counters_warn_instead_of_failing() -> None:
    after = healthy()["items"]["nvfs_stats_after_bench"]["stdout"]
    doc = edited(nvfs_stats_after_bench=file_item(STATS_PATH, without(after, "Writes")))
    [(severity, message)] = findings_for(doc, "GDS-051")
    assert severity == "WARN"
    assert "after the bench: no Writes line" in message and "before" not in message


def test_gdsio_cut_before_throughput_warns_and_the_complete_run_is_still_judged() -> None:
    doc = healthy()
    write = doc["items"]["gdsio_write"]
    write["stdout"] = write["stdout"][: write["stdout"].rindex("Throughput")]
    found = findings_for(doc, "GDS-050")
    # the read run is complete and judged; the write line was cut: no verdict on it
    assert [s for s, _ in found] == ["SKIP", "WARN"]  # read is 4K IO only: not vs the link
    assert "gdsio_write: line 2 (io_type=WRITE xfer_type=GPUD" in found[1][1]
    assert "has no Throughput" in found[1][1]
    only_cut = edited(gdsio_read=None, gdsio_write=write)
    assert findings_for(only_cut, "GDS-050") == [found[1]]
    empty = edited(gdsio_read=None, gdsio_write=command(["gdsio"], "sh-5.1# gdsio -D /d\n"))
    [(severity, message)] = findings_for(empty, "GDS-050")
    assert severity == "WARN" and "gdsio_write: no result line" in message
