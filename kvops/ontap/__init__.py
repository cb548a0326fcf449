"""The ONTAP side of `kvops validate --ontap`: read-only REST client, collection, targets.

Only GETs: the cluster is judged from one evidence document per cluster (`collect`), by the
pure checks in `kvops.checks.ontap`, exactly like the GPU hosts' probe evidence.
"""
