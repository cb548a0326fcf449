"""`kvops validate`'s path: `run` (one request in, the judged fleet out), `collect` (the probe
on every host over SSH, in parallel), `ontap` (the clusters over REST), `judge` (pure: evidence
documents → findings, and the saved bundle's reader and writer)."""
