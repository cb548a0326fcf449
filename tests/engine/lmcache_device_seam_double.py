"""TEST DOUBLE: the one device seam of LMCache, for a CPU vLLM. Never loaded by production code.

Why it exists: the engine tier runs the real vLLM and the real LMCache (the version the
vllm_lmcache role pins) on the CPU. Everything LMCache does — chunking and hashing, the
lookup/store/retrieve protocol with vLLM's connector API, its CPU staging tier, its GDS backend's
file layout, metadata, POSIX I/O and start-up rescan, its metrics — is its own code. Only the
places where LMCache touches a GPU are stood in for here:

1. moving KV between vLLM's paged cache and LMCache's memory objects. LMCache's
   `CreateGPUConnector` (lmcache/v1/gpu_connector/__init__.py) has cuda/xpu/musa/hpu branches and
   raises "No supported cpu connector found" otherwise. `CpuPagedKVConnector` below is modelled on
   LMCache's HPU connector (lmcache/v1/gpu_connector/hpu_connector.py: plain torch indexing),
   adapted to vLLM CPU's layout (vllm/v1/attention/backends/cpu_attn.py:
   `kv_cache.view(NB, NH, 2 * BS, HS).chunk(2, dim=2)`, i.e. per (block, head) a K block then a
   V block — read here as `view(NB, NH, 2, BS, HS)` with slot -> (block, offset) indexing);
2. the GDS backend's three device calls (lmcache/v1/storage_backend/gds_backend.py):
   the `assert dst_device.startswith("cuda")` in `GdsBackend.__init__`, `initialize_allocator`
   (a cuFile-registered GPU buffer, lmcache/v1/memory_allocators/cu_file_memory_allocator.py) and
   `_load_gpu_memcpy` (cudaMemcpy from libcudart, used by LMCache's own POSIX fallback): host
   memory from LMCache's own `GPUMemoryAllocator(device="cpu")` and a `ctypes.memmove`.

How it is loaded: tests/engine/install_engine.sh writes a `.pth` file into the engine venv that
executes this file only when KVOPS_TEST_LMCACHE_DEVICE_SEAM names it. The patches are applied
when LMCache's modules are imported (an import hook, so a process that never imports LMCache
pays nothing) and only when LMCache runs on the CPU.

KVOPS_TEST_LMCACHE_SEAM_CORRUPT=zero-v (negative control only): the V written back into vLLM's
cache on a load is zeroed, so a test can show that outputs depend on the KV LMCache returns.
"""

from __future__ import annotations

import ctypes
import importlib.abc
import importlib.machinery
import os
import sys
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

CORRUPT = os.environ.get("KVOPS_TEST_LMCACHE_SEAM_CORRUPT", "")
_PATCHED_MODULES = ("lmcache.v1.gpu_connector", "lmcache.v1.storage_backend.gds_backend")


def _log(message: str) -> None:
    print(f"kvops test double (LMCache device seam): {message}", file=sys.stderr, flush=True)


def _connector_class() -> type:
    """Built lazily: torch and LMCache are imported only by a process that uses LMCache."""
    import torch
    from lmcache.v1.gpu_connector.gpu_connectors import GPUConnectorInterface
    from lmcache.v1.memory_management import MemoryFormat, MemoryObj

    class CpuPagedKVConnector(GPUConnectorInterface):  # type: ignore[misc]
        """vLLM CPU paged KV <-> LMCache KV_2LTD memory objects ([2, layers, tokens, NH*HS])."""

        def __init__(self, num_layers: int, num_heads: int, head_size: int) -> None:
            self.num_layers = num_layers
            self.num_heads = num_heads
            self.head_size = head_size
            self.kvcaches: list[torch.Tensor] | None = None

        def initialize_kvcaches_ptr(self, **kwargs: Any) -> None:
            if "kvcaches" in kwargs:
                self.kvcaches = list(kwargs["kvcaches"])

        def _paged(self, layer: torch.Tensor) -> torch.Tensor:
            """[NB, BS, 2, NH, HS] view of one layer: the same memory cpu_attn.py reads as
            view(NB, NH, 2 * BS, HS).chunk(2, dim=2)."""
            nb = layer.shape[0]
            bs = layer.numel() // (nb * self.num_heads * 2 * self.head_size)
            view = layer.view(nb, self.num_heads, 2, bs, self.head_size)
            return view.permute(0, 3, 2, 1, 4)

        def _slots(
            self, start: int, end: int, **kwargs: Any
        ) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]:
            self.initialize_kvcaches_ptr(**kwargs)
            assert self.kvcaches, "kvcaches must be passed before the first transfer"
            if "slot_mapping" not in kwargs:
                raise ValueError("'slot_mapping' should be provided in kwargs.")
            slots = kwargs["slot_mapping"][start:end].to(torch.long)
            paged = [self._paged(layer) for layer in self.kvcaches]
            block_size = paged[0].shape[1]
            return slots // block_size, slots % block_size, paged

        def from_gpu(self, memory_obj: MemoryObj, start: int, end: int, **kwargs: Any) -> None:
            assert memory_obj.tensor is not None
            blocks, offsets, paged = self._slots(start, end, **kwargs)
            tokens = end - start
            for i, layer in enumerate(paged):
                kv = layer[blocks, offsets]  # [T, 2, NH, HS]
                memory_obj.tensor[0, i, :tokens].copy_(kv[:, 0].reshape(tokens, -1))
                memory_obj.tensor[1, i, :tokens].copy_(kv[:, 1].reshape(tokens, -1))
            memory_obj.metadata.fmt = MemoryFormat.KV_2LTD

        def to_gpu(self, memory_obj: MemoryObj, start: int, end: int, **kwargs: Any) -> None:
            assert memory_obj.tensor is not None
            blocks, offsets, paged = self._slots(start, end, **kwargs)
            tokens = end - start
            shape = (tokens, self.num_heads, self.head_size)
            for i, layer in enumerate(paged):
                k = memory_obj.tensor[0, i, :tokens].reshape(shape)
                v = memory_obj.tensor[1, i, :tokens].reshape(shape)
                if CORRUPT == "zero-v":
                    v = torch.zeros_like(v)
                layer[blocks, offsets] = torch.stack([k, v], dim=1).to(layer.dtype)

        def batched_from_gpu(
            self, memory_objs: Sequence[MemoryObj], starts: list[int], ends: list[int], **kw: Any
        ) -> None:
            for obj, start, end in zip(memory_objs, starts, ends, strict=True):
                self.from_gpu(obj, start, end, **kw)

        def batched_to_gpu(
            self, memory_objs: Sequence[MemoryObj], starts: list[int], ends: list[int], **kw: Any
        ) -> None:
            for obj, start, end in zip(memory_objs, starts, ends, strict=True):
                self.to_gpu(obj, start, end, **kw)

        def get_shape(self, num_tokens: int) -> torch.Size:
            return torch.Size([2, self.num_layers, num_tokens, self.num_heads * self.head_size])

    return CpuPagedKVConnector


def _patch_gpu_connector(module: ModuleType) -> None:
    """Register the CPU connector where `CreateGPUConnector` raises for the cpu device."""
    import lmcache
    from lmcache.utils import EngineType

    if lmcache.torch_device_type != "cpu":
        return
    original: Callable[..., Any] = module.CreateGPUConnector
    cls = _connector_class()

    def create_gpu_connector(config: Any, metadata: Any, engine: Any, *args: Any, **kw: Any) -> Any:
        if engine != EngineType.VLLM or config.use_layerwise:
            return original(config, metadata, engine, *args, **kw)
        num_layers, _kv, _chunk, num_heads, head_size = metadata.kv_shape
        _log(f"CPU paged-KV connector: {num_layers} layers, {num_heads} KV heads x {head_size}")
        return cls(num_layers, num_heads, head_size)

    module.CreateGPUConnector = create_gpu_connector


class _DeviceName(str):
    """A device name ("cpu:0") that passes GdsBackend.__init__'s
    `assert dst_device.startswith("cuda")` and is the CPU device everywhere else (torch.device,
    the path sharder, the base class)."""

    def startswith(self, prefix: Any, *args: Any) -> bool:
        if prefix == "cuda":
            return True
        return str.startswith(self, prefix, *args)


def _patch_gds_backend(module: ModuleType) -> None:
    """Host memory in place of the GDS backend's three device calls; all else is LMCache's."""
    import lmcache

    if lmcache.torch_device_type != "cpu":
        return
    from lmcache.v1.memory_allocators.gpu_memory_allocator import GPUMemoryAllocator

    backend = module.GdsBackend
    original_init = backend.__init__

    def __init__(self: Any, config: Any, metadata: Any, loop: Any, dst_device: str = "cpu") -> None:
        original_init(self, config, metadata, loop, _DeviceName(dst_device))
        self.dst_device = str(dst_device)

    def initialize_allocator(self: Any, config: Any, metadata: Any) -> Any:
        # cu_file_memory_allocator.py: the same allocator and alignment, minus cuFileBufRegister
        allocator = GPUMemoryAllocator(config.gds_buffer_size * 1024**2, "cpu", align_bytes=4096)
        allocator.base_pointer = allocator.tensor.data_ptr()
        return allocator

    def load_memcpy() -> Callable[..., int]:
        def memcpy(dst: ctypes.c_void_p, src: ctypes.c_void_p, n: ctypes.c_size_t, _k: Any) -> int:
            ctypes.memmove(dst, src, n.value)
            return 0  # cudaSuccess

        return memcpy

    backend.__init__ = __init__
    backend.initialize_allocator = initialize_allocator
    module._load_gpu_memcpy = load_memcpy
    _log("GDS backend on host memory (allocator and memcpy)")


_PATCHES: dict[str, Callable[[ModuleType], None]] = {
    "lmcache.v1.gpu_connector": _patch_gpu_connector,
    "lmcache.v1.storage_backend.gds_backend": _patch_gds_backend,
}


class _PatchingLoader(importlib.abc.Loader):
    def __init__(self, wrapped: importlib.abc.Loader, patch: Callable[[ModuleType], None]) -> None:
        self.wrapped = wrapped
        self.patch = patch

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self.wrapped.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self.wrapped.exec_module(module)
        self.patch(module)


class _PatchOnImport(importlib.abc.MetaPathFinder):
    """Applies a patch right after LMCache's own module has been executed."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        patch = _PATCHES.get(fullname)
        if patch is None:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return None
        spec.loader = _PatchingLoader(spec.loader, patch)
        return spec


def install() -> None:
    for name, patch in _PATCHES.items():
        if name in sys.modules:  # imported before us (not the case via the .pth): patch now
            patch(sys.modules[name])
    if not any(isinstance(f, _PatchOnImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _PatchOnImport())


install()
