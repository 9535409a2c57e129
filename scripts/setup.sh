#!/usr/bin/env bash
# Installs every build and test dependency of nibble on a Debian machine: libraries from apt, test
# tooling from PyPI into .venv. Idempotent and quiet when everything is already there.
set -euo pipefail
cd "$(dirname "$0")/.."

APT_PACKAGES=(cmake ninja-build ccache g++ pkg-config libgtest-dev libbenchmark-dev
              nlohmann-json3-dev libcli11-dev libpcre2-dev libutf8proc-dev libboost-dev
              libsentencepiece-dev)
missing=()
for pkg in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]} (apt)"
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

if ! command -v nvcc >/dev/null && [ ! -x /usr/local/cuda/bin/nvcc ]; then
  echo "setup: note: no CUDA toolkit found; nibble builds CPU-only (CUDA tests need the toolkit)"
fi

# Python test tooling, reinstalled only when tests/requirements.txt changes.
VENV=.venv
STAMP="$VENV/.requirements.sha256"
want=$(sha256sum tests/requirements.txt | cut -d' ' -f1)
if [ ! -x "$VENV/bin/python" ] || [ "$(cat "$STAMP" 2>/dev/null)" != "$want" ]; then
  echo "setup: installing Python test tooling into $VENV (pip)"
  [ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q --disable-pip-version-check -r tests/requirements.txt
  echo "$want" > "$STAMP"
fi
