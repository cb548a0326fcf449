"""The evidence collector that runs ON a GPU host (stdlib only, Python >= 3.8).

It is shipped over SSH as source text (see `kvops.probe.bundle`), run once, and prints one JSON
evidence document in the shape of `kvops.evidence` (mirrored by name here, never imported: the
target has no kvops installed). It only reads and records: every command, file, directory and
HTTP answer becomes an item with its source, exit code, bounded output and duration, and a
missing tool or file is recorded as evidence rather than raised.

Modules shipped: `core` (recording primitives and the time budget), `system` (OS, driver,
modules, nvidia-fs, RDMA, addresses, mounts, IOMMU), `service` (vLLM unit, process, environment,
LMCache, HTTP endpoints), `storage` (cufile.json, gdscheck, GDS directory, gdsio bench) and
`main` (order of collection, the document). `bundle` stays on the client.
"""
