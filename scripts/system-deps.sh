#!/usr/bin/env bash
# The Debian packages the test suite needs beyond Python: one list, used by `make test`
# (through `make system-deps`) and by .ci/run. Installs only what is missing, and only as root
# on an apt system; otherwise prints what is missing and the exact command, and exits 0 so the
# tiers that need them skip with that reason (in CI they fail instead: tests/ci_rule.py).
set -euo pipefail

PACKAGES=(make git openssh-server openssh-client sudo iproute2 mmdebstrap zstd dpkg-dev gpg)

command -v dpkg >/dev/null 2>&1 || { echo "system-deps: not a Debian/Ubuntu system; the lab tier will skip" >&2; exit 0; }

need=()
for pkg in "${PACKAGES[@]}"; do
  dpkg -s "$pkg" >/dev/null 2>&1 || need+=("$pkg")
done
[ "${#need[@]}" -eq 0 ] && exit 0

if [ "$(id -u)" != 0 ]; then
  echo "system-deps: missing ${need[*]}; not root, so not installing them." >&2
  echo "system-deps: the lab and SSH tests will skip; to run them: sudo scripts/system-deps.sh" >&2
  exit 0
fi
echo "system-deps: installing ${need[*]} ..." >&2
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}"
