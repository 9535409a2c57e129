#!/usr/bin/env bash
# `scripts/device.sh wheels`: fetches, here, the wheels the openai-client server tests need on the GPU machine (its python3 is
# 3.12 and has no openai, pytest or requests; nothing can be downloaded there): the versions of
# tests/requirements.txt and their dependencies, into .whl/ (git-ignored). Carry ".whl" with
# build-device; `scripts/device.sh tests` installs them into /tmp/site when it finds them.
set -euo pipefail
cd "$(dirname "$0")/../.."
PACKAGES=(openai==3.57.0 httpx2==2.16.2 httpcore2==2.16.2 anyio==4.16.0 sniffio==1.3.1 jiter==0.19.0
          pydantic==2.14.4 pydantic_core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5
          typing_extensions==4.16.0 h11==0.16.0 idna==3.20 certifi==2026.10.19.post1
          truststore==0.10.5 pytest==9.2.0 pluggy==1.7.0 iniconfig==2.3.1 packaging==26.4 Pygments==2.21.0
          requests==2.34.2 urllib3==2.8.0 charset-normalizer==3.5.3 jsonschema==4.26.0 referencing==0.37.0
          jsonschema-specifications==2025.9.1 rpds-py==2026.9.1 attrs==26.1.0)
rm -rf .whl && mkdir -p .whl
for p in "${PACKAGES[@]}"; do
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d .whl "$p"
done
du -sh .whl
