"""The model's uncertainty: the ranges its profiles' estimated figures can plausibly take.

The shipped profiles give one value for figures that are estimates, and say so in their
comments; these are the bounds kvops puts around them:
- prefill MFU: the profiles use 0.55; large bf16 GEMMs reach ~0.80 of dense peak and whole
  prefills with attention and norms land lower, so 0.45-0.65 (x0.82 .. x1.18);
- storage goodput: the ONTAP profiles estimate ~85% of line rate after RoCE/NFS framing (reads)
  and ~75% (writes); 60% to 98% of line rate covers a congested to an ideal path
  (x0.7 .. x1.15 of the profile's figure);
- per-I/O latency: "sub-millisecond" (NetApp AFF datasheets) around the profiles' 200 us:
  x0.5 .. x2.5.
Two corners bound the answer: one where offload looks worst (slow storage, fast recompute) and
one where it looks best (fast storage, slow recompute). Every other combination lies between
them for the deltas kvops reports, since offload's gain grows with read bandwidth and shrinks
with compute speed.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from kvops.advise.arms import Profiles

MFU_FACTORS = (1.18, 0.82)  # (worst for offload, best for offload)
STORAGE_BANDWIDTH_FACTORS = (0.7, 1.15)
IO_LATENCY_FACTORS = (2.5, 0.5)


@dataclass(frozen=True)
class Corner:
    name: str
    profiles: Profiles


def corners(profiles: Profiles) -> list[Corner]:
    """The pessimistic and the optimistic corner for offload, as modified profiles."""
    out = []
    for i, name in enumerate(("worst case for offload", "best case for offload")):
        gpu = dataclasses.replace(
            profiles.gpu, prefill_mfu=profiles.gpu.prefill_mfu * MFU_FACTORS[i]
        )
        s = profiles.storage
        storage = dataclasses.replace(
            s,
            read_bandwidth_gb_s=s.read_bandwidth_gb_s * STORAGE_BANDWIDTH_FACTORS[i],
            write_bandwidth_gb_s=s.write_bandwidth_gb_s * STORAGE_BANDWIDTH_FACTORS[i],
            io_latency_us=s.io_latency_us * IO_LATENCY_FACTORS[i],
        )
        out.append(Corner(name, Profiles(profiles.model, gpu, storage)))
    return out


def with_read_bandwidth(profiles: Profiles, read_gb_s: float) -> Profiles:
    """The same hardware with another storage read bandwidth (a sweep point)."""
    storage = dataclasses.replace(profiles.storage, read_bandwidth_gb_s=read_gb_s)
    return Profiles(profiles.model, profiles.gpu, storage)
