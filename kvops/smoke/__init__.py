"""`kvops smoke`'s path: `run` (the I/O: requests, metrics scrapes, chunk-file looks), `remote`
(those looks on the host over the validate transport, with `--host`), `chunk_files` (LMCache's
GDS file layout, read where the directory is mounted), `judge` (pure: evidence → findings)."""
