#!/usr/bin/env bash
# Installs every build and test dependency of nibble on a Debian machine: libraries from apt, test
# tooling from PyPI into .venv. Idempotent and quiet when everything is already there.
set -euo pipefail
cd "$(dirname "$0")/.."

APT_PACKAGES=(cmake ninja-build ccache g++ pkg-config libgtest-dev libbenchmark-dev
              nlohmann-json3-dev libcli11-dev libpcre2-dev libutf8proc-dev libboost-dev
              libsentencepiece-dev curl ca-certificates)
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

# FlashInfer's header-only CUDA templates (attention), with the CCCL headers they need, from one
# pinned, hash-checked flashinfer-python wheel (docs/third_party.md): used at build time only, never copied
# into the repository; only src/cuda/attention/flashinfer_attention*.cu(h) include them.
FLASHINFER_VERSION=0.7.2.post1
FLASHINFER_SHA256=bfdc18b9e1e4d8d0730fe4343dc0e284cd0c160086de80f99888bc4867922d49
FLASHINFER_DIR=.deps/flashinfer-$FLASHINFER_VERSION
if [ ! -f "$FLASHINFER_DIR/.complete-cutlass" ]; then
  echo "setup: fetching flashinfer-python $FLASHINFER_VERSION headers (pip download, sha256-checked)"
  rm -rf "$FLASHINFER_DIR" && mkdir -p "$FLASHINFER_DIR"
  wheel_dir=$(mktemp -d)
  "$VENV/bin/pip" download -q --disable-pip-version-check --no-deps --only-binary :all: \
    "flashinfer-python==$FLASHINFER_VERSION" -d "$wheel_dir"
  wheel=$(ls "$wheel_dir"/flashinfer_python-*.whl)
  echo "$FLASHINFER_SHA256  $wheel" | sha256sum -c --quiet -
  # Only the headers (FlashInfer's include/, CCCL, CUTLASS/CuTe for its SM90 attention) and the licences.
  "$VENV/bin/python" - "$wheel" "$FLASHINFER_DIR" <<'PY'
import sys, zipfile
wheel, out = sys.argv[1], sys.argv[2]
keep = ("flashinfer/data/include/", "flashinfer/data/cccl/", "flashinfer/data/cutlass/include/",
        "flashinfer/data/cutlass/tools/util/include/")
with zipfile.ZipFile(wheel) as z:
    for name in z.namelist():
        if name.startswith(keep) or "LICENSE" in name.upper().split("/")[-1]:
            z.extract(name, out)
PY
  rm -rf "$wheel_dir"
  touch "$FLASHINFER_DIR/.complete-cutlass"
fi

# xgrammar's C++ core (structured output), from its pinned, hash-checked sdist on PyPI (docs/third_party.md):
# cmake/xgrammar.cmake builds it as a static library with the Python bindings left out; never copied into
# the repository; only src/grammar/ includes its headers.
XGRAMMAR_VERSION=0.2.8
XGRAMMAR_SHA256=8305646fd2b319d6c3003f51a1665e54cbbe9cba1fb636bc41d0b46434ccbb80
XGRAMMAR_URL=https://files.pythonhosted.org/packages/03/0f/29f521535729be740779c2c98b630ef6607cf28be9b669895dd2b821ff63/xgrammar-$XGRAMMAR_VERSION.tar.gz
XGRAMMAR_DIR=.deps/xgrammar-$XGRAMMAR_VERSION
if [ ! -f "$XGRAMMAR_DIR/.complete" ]; then
  echo "setup: fetching the xgrammar $XGRAMMAR_VERSION sdist (sha256-checked)"
  rm -rf "$XGRAMMAR_DIR" && mkdir -p .deps
  archive=$(mktemp --suffix=.tar.gz)
  curl -fsSL --retry 3 -o "$archive" "$XGRAMMAR_URL"
  echo "$XGRAMMAR_SHA256  $archive" | sha256sum -c --quiet -
  tar -xzf "$archive" -C .deps
  rm -f "$archive"
  touch "$XGRAMMAR_DIR/.complete"
fi
