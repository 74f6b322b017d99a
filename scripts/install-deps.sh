#!/usr/bin/env bash
# Installs every Debian package tally's build, tests and benchmarks need; clang-14 and
# libclang-rt-14-dev (which holds libclang_rt.fuzzer) are for scripts/fuzz.sh's libFuzzer harnesses;
# iproute2's `ip netns` makes the two "hosts" of the multi-host tests (tests/engine/netns_fixture.hpp).
# chromium loads the `--html FILE` pages in a real (headless) browser: tests/cli/test_html.cpp checks
# that their charts render without script errors and takes a screenshot, and drives `tally serve`'s
# page (tests/cli/test_serve.cpp). libcpp-httplib-dev is cpp-httplib, the HTTP server of `tally serve`
# (linked into the tally executable only) and the client of its tests.
# Safe to run twice: apt-get skips what is already installed, and the package-list refresh is
# skipped when every package is present.
set -euo pipefail

PKGS=(
  build-essential cmake ninja-build pkg-config
  libgtest-dev libgmock-dev googletest libbenchmark-dev
  libtorch-dev libgloo-dev libcli11-dev nlohmann-json3-dev libfmt-dev libcpp-httplib-dev
  libopenblas0-pthread
  python3-torch python3-numpy
  clang-14 libclang-rt-14-dev
  iproute2
  chromium
)

missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#PKGS[@]} packages present"
  exit 0
fi

SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
echo "install-deps: installing ${missing[*]}"
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
