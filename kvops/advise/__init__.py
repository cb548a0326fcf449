"""`kvops advise`: will KV-cache offload pay for this traffic on this hardware?

Answered before anything is deployed, from the simulator's physics (`kvops.sim`), in two ways:
- `sizing`: closed-form arithmetic over the profiles (KV bytes, GPU capacity, prefill and load
  times, the break-even read bandwidth), instant;
- a trace, an ab-test `records.jsonl` or a workload preset replayed through both arms of the
  model in virtual time (`arms`), judged (`recommend`) and rendered (`render`).
Pure logic lives apart from I/O: `trace` and `storage_evidence` read files, everything else
takes values and returns values.
"""
