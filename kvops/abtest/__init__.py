"""`kvops ab-test`'s path: the experiment (arms, ABBA segments, resets, embedded engines,
`--deploy`), the run directory, and the results document (`result_types`) with the metrics it
is built from (`metrics`: `vllm bench serve` definitions, paired intervals, verdicts)."""
