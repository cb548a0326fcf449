"""kvops' TTFT error end to end, its way in included, beside inference-perf's in the same run.

`vllm bench serve` defines TTFT from the request's send to its first token; whatever the client
does between its send stamp and the request reaching the server (encoding, acquiring a
connection, writing the body, its event loop's other work) is counted as the server's time, as
is whatever happens between the server writing a chunk and the client stamping it.

Against the fixed-delay double (tests/doubles/fixed_delay_server.py: first chunk 50 ms after
the request's last byte arrived, then one every 10 ms; it logs the CLOCK_MONOTONIC instants of
the arrival and of each write, the clock behind `time.perf_counter`, shared by every process on
Linux), with 640-token prompts and 16 output tokens, N streams in closed loop (a cap of N in
flight; 5 requests per stream released on inference-perf's own `concurrent` schedule, so both
clients put the same load on the double), it prints per configuration and client:
  - send side:    arrival - the client's send stamp (kvops: `RequestRecord.send_perf_s`);
  - receive side: the client's first-chunk stamp - the double's first write;
  - end to end:   the client's TTFT - the server's own time (first write - arrival)
                  = send side + receive side: the whole error the client adds to a TTFT;
  - the peak number in flight, the double's own lateness, kvops' loop lag and whether kvops
    calls itself client-bound (its ab-test judgement, the smallest-TTFT share included);
at 64, 256 and 1,024 streams, with one process and with `--workers` processes (kvops' worker
pool; inference-perf's `num_workers`), then kvops' end-to-end error as a ratio to inference-perf's
(https://github.com/kubernetes-sigs/inference-perf) and the issue's done-when per configuration.
Each client runs `--pairs` times in ABBA order per configuration, requests pooled.

The peer, inference-perf, needs Python >= 3.12 and gets its own virtual environment, made on
first use under ~/.cache/kvops/bench-peer-venv from benchmarks/requirements-peer.txt (PyPI
only). It sends text, not token ids (its completion prompts are strings): its `random`
generator draws ids from a word-level tokenizer written locally (`_TOKENIZER_SCRIPT`, nothing
downloaded), one word per token, so its prompts are 640 tokens on both sides too. Its stamps
come from its per-request report (start_time, chunk_times: `time.perf_counter`); with worker
processes they are on another base, so only its end-to-end error is shown. `--no-peer` skips it.

Done when (issue "TTFT error end to end"): at 64 streams kvops' end-to-end error is within
1 ms and no larger than inference-perf's; at 256 no larger, or kvops calls itself client-bound.
Figures move with the machine's load: the ratios, measured in one run, are the claim.

  python benchmarks/loadgen_ttft_error.py [--quick] [--levels 64,256] [--workers N]
                                          [--pairs N] [--no-peer]
"""

from __future__ import annotations

import asyncio
import glob
import itertools
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from doubles.fixed_delay_server import running
from loadgen_overhead import client_arguments

from kvops.loadgen import CompletionRequest, Endpoint, RequestRecord, make_session
from kvops.loadgen.runner import (
    ClientStats,
    Labels,
    LoopLagMonitor,
    Runner,
    WireRequest,
    judge_client,
)
from kvops.loadgen.workers import WorkerPool

PROMPT_TOKENS = 640
OUTPUT_TOKENS = 16
FIRST_MS, GAP_MS = 50.0, 10.0
VOCAB = 1_000_000  # the double rejects ids past it; measured prompts end in a unique id
BODY_VOCAB = 32_000  # the other 639 ids: a llama-sized vocabulary, so the body has its size
MARK_BASE = 100_000  # measured prompts end in an id >= this: it pairs record and log line
SEED = 20261205
ROUNDS = 5  # requests per stream: short points (a few seconds each)
_marks = itertools.count(MARK_BASE)
# (prompt key, send, first chunk, end): a client's perf_counter stamps of one request
Stamp = tuple[object, float, float, float]


def _prompts(n: int, rng: np.random.Generator) -> list[list[int]]:
    """`n` seeded 640-token prompts, each ending in its own id (the pairing mark)."""
    body = rng.integers(2, BODY_VOCAB, size=(n, PROMPT_TOKENS - 1))
    return [[*map(int, row), next(_marks)] for row in body]


def _wire(prompts: list[list[int]], endpoint: Endpoint, tag: str) -> list[WireRequest]:
    out = []
    for p in prompts:
        req = CompletionRequest(f"{tag}{p[-1]}", p, OUTPUT_TOKENS)
        req.body(endpoint)  # encoded before the clock, as the ab-test runner does
        out.append(WireRequest(0, 0, req))
    return out


def release_offsets(n: int, rng: np.random.Generator) -> list[float]:
    """When each request may go (s after the start), at most `streams` in flight: the schedule
    of inference-perf's `concurrent` load type, so both clients put the same load on the
    double — all requests due within 1 s (its main.py: duration 1, rate = num_requests) at
    exponential intervals scaled to sum to 1 s (load_timer.ConstantLoadTimer). With 5 requests
    per stream and ~0.2 s per request, more is due than the cap lets out: the cap, not the
    schedule, sets the concurrency once the first ~0.2 s have passed."""
    intervals = rng.exponential(1.0 / n, n)
    return [float(t) for t in np.cumsum(intervals / intervals.sum())]


async def _closed_loop(
    url: str, streams: int, workers: int, rng: np.random.Generator
) -> tuple[list[RequestRecord], ClientStats]:
    """`streams` streams in closed loop (a concurrency cap; requests due as `release_offsets`
    says), after a warm-up round that opens the connections."""
    endpoint = Endpoint(url, "fixed-delay")
    warm = _wire(_prompts(streams, rng), endpoint, "w")
    planned = _wire(_prompts(streams * ROUNDS, rng), endpoint, "r")
    offsets = release_offsets(len(planned), rng)
    records: list[RequestRecord] = []
    stats = ClientStats()
    if workers == 1:
        async with make_session(streams) as session:
            runner = Runner(session, endpoint, records.append)
            await runner.run_group(warm, Labels(warmup=True), None, streams)
            records.clear()
            runner.stats = stats
            monitor = LoopLagMonitor(stats)
            monitor.start()
            await runner.run_group(planned, Labels(), offsets, streams)
            await monitor.stop()
    else:
        pool = WorkerPool(workers, endpoint)
        try:
            await pool.start()
            await pool.run_group(warm, Labels(warmup=True), lambda r: None, None, streams)
            await pool.run_group(planned, Labels(), records.append, offsets, streams, stats)
        finally:
            pool.close()
    return records, stats


def _log_entries(log_dir: Path) -> list[dict[str, object]]:
    out = []
    for log in log_dir.glob("*.jsonl"):
        for line in log.read_text().splitlines():
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                continue  # a line being appended right now
    return out


def _wait_log(log_dir: Path, keys: set[object], since: float) -> list[dict[str, object]]:
    """The double's entries for requests that arrived after `since`, once every key in `keys`
    is there (or 5 s passed): the double logs a request after its last write."""
    deadline = time.monotonic() + 5.0
    while True:
        entries = [e for e in _log_entries(log_dir) if float(e["arrived_monotonic_s"]) >= since]  # type: ignore[arg-type]
        if keys <= {_key(e["prompt"]) for e in entries} or time.monotonic() > deadline:
            return entries
        time.sleep(0.1)


# --- the peer: inference-perf in its own environment ---------------------------------------

PEER_VENV = Path.home() / ".cache" / "kvops" / "bench-peer-venv"
PEER_REQUIREMENTS = Path(__file__).with_name("requirements-peer.txt")
_peer_runs = itertools.count(1)

# A word-level tokenizer written locally (tokenizers' WordLevel model, saved through
# transformers' PreTrainedTokenizerFast), so inference-perf's `random` generator — which draws
# token ids and decodes them to text of exact length — needs no Hugging Face download: ids 2..
# 31999 are the words "t2".."t31999", and the double counts one token per word (+ BOS), as the
# tokenizer does, so prompts are 640 tokens on both sides and about kvops' body size.
_TOKENIZER_SCRIPT = """
import sys
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast
vocab = {"[UNK]": 0, "<s>": 1, **{f"t{i}": i for i in range(2, int(sys.argv[2]))}}
tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
tok.decoder = decoders.WordPiece(prefix="##")
PreTrainedTokenizerFast(
    tokenizer_object=tok, unk_token="[UNK]", bos_token="<s>", model_max_length=65536
).save_pretrained(sys.argv[1])
"""


def _python_312() -> str | None:
    """A Python >= 3.12 for inference-perf's environment: on PATH, else a pyenv version."""
    names = ["python3.13", "python3.12", "python3"]
    found = [shutil.which(n) for n in names]
    found += sorted(glob.glob(str(Path.home() / ".pyenv/versions/3.1[2-9]*/bin/python3")))
    for exe in found:
        if not exe:
            continue
        probe = subprocess.run(
            [exe, "-c", "import sys; print(sys.version_info >= (3, 12))"],
            capture_output=True,
            text=True,
            check=False,
        )
        if probe.stdout.strip() == "True":
            return exe
    return None


def peer_env() -> tuple[Path | None, str]:
    """inference-perf's console script, installed on first use (PyPI only), or why not."""
    exe = PEER_VENV / "bin" / "inference-perf"
    if exe.exists():
        return exe, "installed"
    python = _python_312()
    if python is None:
        return None, "no Python >= 3.12 for inference-perf (it requires it)"
    print(f"installing inference-perf into {PEER_VENV} (once) ...", flush=True)
    try:
        subprocess.run([python, "-m", "venv", str(PEER_VENV)], check=True)
        pip = [str(PEER_VENV / "bin" / "python"), "-m", "pip", "install", "--quiet"]
        subprocess.run([*pip, "-r", str(PEER_REQUIREMENTS)], check=True)
    except subprocess.CalledProcessError as exc:
        return None, f"installing inference-perf failed: {exc}"
    return exe, "installed now"


def _peer_config(
    url: str, streams: int, workers: int, tokenizer: Path, out: Path, seed: int
) -> str:
    """inference-perf's closed loop at `streams` (its `concurrent` load type), the same prompt
    and output lengths, over `workers` processes; per-request report with chunk times."""
    n = streams * ROUNDS
    cfg = {
        "api": {"type": "completion", "streaming": True},
        "data": {
            "type": "random",
            "input_distribution": {"min": PROMPT_TOKENS, "max": PROMPT_TOKENS,
                                   "mean": PROMPT_TOKENS, "std_dev": 0, "total_count": n},
            "output_distribution": {"min": OUTPUT_TOKENS, "max": OUTPUT_TOKENS,
                                    "mean": OUTPUT_TOKENS, "std_dev": 0, "total_count": n},
        },
        "load": {
            "type": "concurrent",
            "stages": [{"num_requests": n, "concurrency_level": streams}],
            "num_workers": workers,
            "worker_max_concurrency": math.ceil(streams / workers),
            "base_seed": seed,
        },
        "server": {"type": "vllm", "model_name": "fixed-delay", "base_url": url,
                   "ignore_eos": True},
        "tokenizer": {"pretrained_model_name_or_path": str(tokenizer)},
        "storage": {"local_storage": {"path": str(out)}},
        "report": {"request_lifecycle": {
            "summary": True, "per_stage": False, "per_request": True,
            "per_request_fields": {"request": True, "response": False, "info": True,
                                   "response_chunks": False},
        }},
    }  # fmt: skip
    return json.dumps(cfg)  # YAML is a superset of JSON


def run_peer(exe: Path, url: str, streams: int, workers: int, tmp: Path) -> list[Stamp] | str:
    """(prompt, send, first chunk, end) stamps per successful inference-perf request, or why
    there are none. Its stamps are `time.perf_counter()` too (its openai_client.py)."""
    tokenizer = tmp / "peer-tokenizer"
    if not tokenizer.exists():
        subprocess.run(
            [str(exe.parent / "python"), "-c", _TOKENIZER_SCRIPT, str(tokenizer), str(BODY_VOCAB)],
            check=True,
        )
    run = next(_peer_runs)  # its own seed (so its own prompts: they pair with the log) and files
    out = tmp / f"peer-{run}"
    cfg = tmp / f"peer-{run}.yml"
    cfg.write_text(_peer_config(url, streams, workers, tokenizer, out, SEED + run))
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    try:
        done = subprocess.run(
            [str(exe), "--config_file", str(cfg)],
            capture_output=True,
            text=True,
            env=env,
            check=False,
            timeout=600,
        )
    except subprocess.TimeoutExpired:
        return "inference-perf ran past 600 s: stopped"
    report = out / "per_request_lifecycle_metrics.json"
    if done.returncode != 0 or not report.exists():
        return f"inference-perf exited {done.returncode}: {done.stderr.strip()[-300:]}"
    rows = []
    for entry in json.loads(report.read_text()):
        info = entry.get("info") or {}
        chunks = (info.get("response_metrics") or {}).get("chunk_times") or []
        if entry.get("error") not in (None, "None") or not chunks:
            continue
        prompt = json.loads(entry["request"])["prompt"]
        rows.append(
            (prompt, float(entry["start_time"]), float(chunks[0]), float(entry["end_time"]))
        )
    return rows


@dataclass
class Sides:
    """Means over the requests paired with the double's log, in ms."""

    n: int
    peak: int  # the most requests in flight at once (send to end)
    send_ms: float
    send_p99_ms: float
    receive_ms: float
    server_ms: float  # first write - arrival: the double's 50 ms plus its own lateness
    ttft_ms: float
    # the client's stamps and the double's are on one clock: 95% of requests or more did not
    # arrive before they were sent nor were seen before they were written (by 1 ms). A few
    # may: the double stamps a write after it returned, and a double descheduled in
    # between stamps late. inference-perf's worker processes report stamps on another base
    # (both sides off by the same hundreds of ms, in opposite directions): its TTFT (both
    # stamps from one process), so its end-to-end error, holds; its two sides do not.
    one_clock: bool

    @property
    def e2e_ms(self) -> float:
        """The client's whole TTFT error: measured TTFT - the server's own time."""
        return self.ttft_ms - self.server_ms


def _key(prompt: object) -> object:
    """kvops' prompts are paired by their last id, the peer's (text) by the whole prompt."""
    return prompt[-1] if isinstance(prompt, list) else prompt


def _peak(stamps: list[Stamp]) -> int:
    edges = sorted([(s[1], 1) for s in stamps] + [(s[3], -1) for s in stamps])
    return max(itertools.accumulate(step for _, step in edges), default=0)


def sides(stamps: list[Stamp], entries: list[dict[str, object]]) -> Sides | None:
    """Pairs (prompt key, client send, first chunk, end) stamps with the double's log."""
    log = {_key(e["prompt"]): e for e in entries}
    send, recv, server, ttft = [], [], [], []
    for key, sent, first_seen, _end in stamps:
        e = log.get(key)
        if e is None:
            continue
        arrived = float(e["arrived_monotonic_s"])  # type: ignore[arg-type]
        first_written = float(e["chunk_written_monotonic_s"][0])  # type: ignore[index]
        send.append((arrived - sent) * 1e3)
        recv.append((first_seen - first_written) * 1e3)
        server.append((first_written - arrived) * 1e3)
        ttft.append((first_seen - sent) * 1e3)
    if not ttft:
        return None
    behind = sum(1 for a, b in zip(send, recv, strict=True) if a < -1.0 or b < -1.0)
    one_clock = behind <= 0.05 * len(send)
    return Sides(
        n=len(ttft),
        peak=_peak(stamps),
        send_ms=statistics.mean(send),
        send_p99_ms=float(np.percentile(send, 99)),
        receive_ms=statistics.mean(recv),
        server_ms=statistics.mean(server),
        ttft_ms=statistics.mean(ttft),
        one_clock=one_clock,
    )


def kvops_stamps(records: list[RequestRecord]) -> list[Stamp]:
    return [
        (
            int(r.request_id.rpartition("/")[2][1:]),
            r.send_perf_s,
            r.send_perf_s + r.chunk_offsets_ms[0] / 1e3,
            r.end_perf_s,
        )
        for r in records
        if r.ok and r.chunk_offsets_ms
    ]


HEADER = (
    f"{'configuration':<19} {'client':<14} {'paired':>6} {'peak':>5} | {'send':>6} {'p99':>6} "
    f"{'receive':>7} {'e2e err':>7} | {'server':>6} {'loop lag':>8} {'bound':>5} {'load':>5}"
)


def _line(label: str, client: str, s: Sides | None, judged: dict[str, object] | None) -> str:
    if s is None:
        return f"{label:<19} {client:<14} {'none':>6} |"
    lag_ms = float(judged["loop_lag_mean_ms"]) if judged else None  # type: ignore[arg-type]
    lag = f"{lag_ms:5.2f} ms" if lag_ms is not None else f"{'-':>8}"
    bound = ("YES" if judged["bottleneck"] else "no") if judged else "-"
    if s.one_clock:
        both = f"{s.send_ms:+6.2f} {s.send_p99_ms:+6.2f} {s.receive_ms:+7.2f}"
    else:
        both = f"{'n/a':>6} {'':>6} {'n/a':>7}"
    return (
        f"{label:<19} {client:<14} {s.n:>6} {s.peak:>5} | {both} {s.e2e_ms:+7.2f} | "
        f"{s.server_ms - FIRST_MS:+6.2f} {lag} {bound:>5} {os.getloadavg()[0]:5.1f}"
    )


def _configuration(
    url: str,
    log_dir: Path,
    tmp: Path,
    streams: int,
    workers: int,
    peer: Path | None,
    pairs: int,
    rng: np.random.Generator,
) -> tuple[Sides | None, Sides | None, dict[str, object], str | None]:
    """One configuration, each client run `pairs` x 2 times in ABBA order (kvops, peer, peer,
    kvops, ...) and their requests pooled: the machine's load drifts during a run, and the
    order spreads the drift over both clients alike."""
    since = time.monotonic()
    ours: list[Stamp] = []
    theirs: list[Stamp] = []
    stats = ClientStats()
    problem: str | None = None
    order = ["kvops", "peer", "peer", "kvops"] * pairs
    for who in order if peer is not None else ["kvops"] * (2 * pairs):
        if who == "kvops":
            recs, one = asyncio.run(_closed_loop(url, streams, workers, rng))
            ours += kvops_stamps(recs)
            stats.merge(one)
            stats.workers = one.workers
        elif peer is not None and problem is None:
            got = run_peer(peer, url, streams, workers, tmp)
            if isinstance(got, str):
                problem = got
            else:
                theirs += got
    entries = _wait_log(log_dir, {st[0] for st in ours + theirs}, since)
    mine = sides(ours, entries)
    # as the ab-test report judges it: the run's one arm is its smallest mean TTFT
    ttft = mine.ttft_ms if mine else None
    judged = judge_client(stats.summary(), ttft, None, smallest_ttft_ms=ttft)
    return mine, sides(theirs, entries), judged, problem


def main() -> None:
    ap = client_arguments(__doc__)
    ap.add_argument("--no-peer", action="store_true", help="do not run inference-perf")
    ap.add_argument("--levels", default="", help="comma-separated stream counts (override)")
    ap.add_argument("--pairs", type=int, default=1, help="ABBA pairs of runs per client")
    args = ap.parse_args()
    levels: tuple[int, ...] = (64, 256) if args.quick else (64, 256, 1024)
    if args.levels:
        levels = tuple(int(x) for x in args.levels.split(","))
    rng = np.random.default_rng(SEED)
    peer, why = (None, "--no-peer") if args.no_peer else peer_env()
    print(
        f"machine: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}; server "
        f"processes {args.server_processes}; {PROMPT_TOKENS}-token prompts (kvops: token ids; "
        f"inference-perf: text of as many words, one token each), {OUTPUT_TOKENS} output "
        f"tokens, closed loop, {ROUNDS} requests per stream; inference-perf: "
        f"{'run' if peer else 'NOT run: ' + why}"
    )
    print(
        "ms, means over requests: send = arrival - the client's send stamp; receive = the "
        "client's first-chunk stamp - the double's first write; e2e err = TTFT - (first write "
        "- arrival) = send + receive; server = first write - arrival - 50 ms (the double's "
        "lateness: not a client error); bound = kvops calls itself client-bound\n"
    )
    print(HEADER)
    table: dict[tuple[int, int], tuple[Sides | None, Sides | None, dict[str, object]]] = {}
    with tempfile.TemporaryDirectory(prefix="kvops-ttft-error-") as tmp_name:
        tmp = Path(tmp_name)
        log_dir = tmp / "log"
        log_dir.mkdir()
        log = ("--timing-log", str(log_dir), "--vocab-size", str(VOCAB))
        with running(*log, processes=args.server_processes) as (url, _):
            for streams in levels:
                for workers in (1, args.workers):
                    label = f"{streams} streams, {workers} proc"
                    row = _configuration(url, log_dir, tmp, streams, workers, peer, args.pairs, rng)
                    ours, theirs, judged, problem = row
                    print(_line(label, "kvops", ours, judged), flush=True)
                    if peer is not None:
                        print(_line("", "inference-perf", theirs, None), flush=True)
                    if problem:
                        print(f"{'':<19} inference-perf: {problem}", flush=True)
                    table[(streams, workers)] = (ours, theirs, judged)
    print("\nkvops' end-to-end TTFT error against inference-perf's, same double, same run:")
    for (streams, workers), (ours, theirs, judged) in table.items():
        if ours is None:
            continue
        ratio = (
            f"x{ours.e2e_ms / theirs.e2e_ms:.2f}"
            if theirs is not None and theirs.e2e_ms > 0
            else "n/a"
        )
        peer_txt = f"{theirs.e2e_ms:+.2f} ms" if theirs is not None else "not run"
        print(
            f"  {streams:>5} streams, {workers} proc: kvops {ours.e2e_ms:+.2f} ms "
            f"(send {ours.send_ms:+.2f}, receive {ours.receive_ms:+.2f}), inference-perf "
            f"{peer_txt}: ratio {ratio}; kvops client-bound: "
            f"{'YES (' + str(judged['bottleneck_reason']) + ')' if judged['bottleneck'] else 'no'}"
        )
    print("\ndone-when (issue: TTFT error end to end), per configuration:")
    for (streams, workers), (ours, theirs, judged) in table.items():
        if ours is None or streams not in (64, 256):
            continue
        no_larger = theirs is not None and ours.e2e_ms <= theirs.e2e_ms
        if streams == 64:
            met = no_larger and ours.e2e_ms <= 1.0
            want = "within 1 ms and no larger than inference-perf's"
        else:
            met = no_larger or bool(judged["bottleneck"])
            want = "no larger than inference-perf's, or kvops says client-bound"
        print(
            f"  {streams} streams, {workers} proc: {want}: {'met' if met else 'NOT met'} "
            f"(kvops {ours.e2e_ms:+.2f} ms"
            + (f", inference-perf {theirs.e2e_ms:+.2f} ms" if theirs is not None else "")
            + f"; client-bound: {'yes' if judged['bottleneck'] else 'no'})"
        )


if __name__ == "__main__":
    main()
