"""kvops: provision, validate and prove KV-cache offload for vLLM + LMCache on ONTAP."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("kvops")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0.0.0+unknown"
