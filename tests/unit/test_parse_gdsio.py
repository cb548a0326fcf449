"""gdsio result-line parser against every recorded output."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvops.parse.gdsio import parse_gdsio

FIXTURES = Path(__file__).parent.parent / "fixtures" / "gdsio"


def load(name: str) -> str:
    return (FIXTURES / name).read_text(encoding="utf-8")


def test_netapp_runs_skip_prompt_lines() -> None:
    out = parse_gdsio(load("openshift-l40s-netapp-nfs-rdma.txt"))
    assert [(r.io_type, r.xfer_type, r.io_size_kib) for r in out.results] == [
        ("RANDWRITE", "GPUD", 4),
        ("RANDREAD", "GPUD", 4),
        ("WRITE", "GPUD", 1024),
    ]
    write = out.results[2]
    assert write.threads == 32
    assert write.throughput_gib_s == pytest.approx(2.547637)
    assert write.avg_latency_us == pytest.approx(12487.658159)
    assert write.dataset_done_kib == 320301056  # timed mode: numerator > total
    assert write.dataset_total_kib == 33554432
    assert write.ops == 312794
    assert write.total_time_s == pytest.approx(119.900455)
    assert write.gpu_direct and not write.is_read
    assert out.warnings == []


def test_xfer_types_on_ext4() -> None:
    out = parse_gdsio(load("quadro-p1000-ext4-nvme-xfer-types.txt"))
    assert len(out.results) == 12
    assert {r.xfer_type for r in out.results} == {"CPUONLY", "CPU_GPU", "GPUD"}
    assert {r.io_type for r in out.results} == {"READ", "WRITE", "RANDREAD", "RANDWRITE"}
    assert [r.gpu_direct for r in out.results].count(True) == 4


def test_single_write_line() -> None:
    out = parse_gdsio(load("gh-issue-gds-nvidia-fs-78-single-write.txt"))
    assert len(out.results) == 1
    assert out.results[0].throughput_gib_s == pytest.approx(0.013104)


def test_help_text_has_no_results_and_no_warnings() -> None:
    out = parse_gdsio(load("gdsio-help-v1.12.txt"))
    assert out.results == [] and out.warnings == []


def test_truncated_result_line_is_a_warning() -> None:
    line = load("gh-issue-gds-nvidia-fs-78-single-write.txt").strip()
    out = parse_gdsio(line[: line.index("Throughput")] + "\n")
    assert out.results == []
    assert "cut short" in out.warnings[0] and out.partial[0].missing[0] == "Throughput"


def test_variable_io_size_and_old_units() -> None:
    text = (
        "IoType: READ XferType: GPUD Threads: 4 DataSetSize: 100/100(KiB) IOSize: 4-32-1(KiB) "
        "Throughput: 1.5 GiB/sec, Avg_Latency: 10.0 usecs ops: 5 total_time 1.0 secs\n"
        "IoType: WRITE XferType: GPUD Threads: 1 DataSetSize: 8/8(KB) IOSize: 4(KB),"
        "Throughput: 0.004727 GB/sec, Avg_Latency: 826.25 usecs ops: 2 "
        "total_time 2000000.000000 usecs\n"
    )
    out = parse_gdsio(text)
    assert out.results[0].io_size_kib is None and out.results[0].io_size_text == "4-32-1"
    assert out.results[1].io_size_kib == 4
    assert out.results[1].total_time_s == pytest.approx(2.0)
    assert any("GB/sec" in w for w in out.warnings)


def test_to_dict_has_one_object_per_line() -> None:
    document = parse_gdsio(load("openshift-l40s-netapp-nfs-rdma.txt")).to_dict()
    assert len(document["results"]) == 3
    assert set(document["results"][0]) >= {
        "io_type",
        "xfer_type",
        "threads",
        "throughput_gib_s",
        "avg_latency_us",
    }


def test_number_without_digits_is_a_warning_not_a_crash() -> None:
    out = parse_gdsio("IoType: READ XferType: GPUD Threads: 1 Throughput: . GiB/sec\n")
    assert out.results == [] and out.warnings
