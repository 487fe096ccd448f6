#!/usr/bin/env bash
# Install everything the tests need, build the Cython kernels, run the whole suite.
# This is the README's second quick-start command; .ci/run calls it verbatim.
#   bash tools/test.sh [pytest args...]
set -euo pipefail
cd "$(dirname "$0")/.."

# Debian packages: a JDK for PySpark, kcat for the real-client tests, libfuse 3 and
# fusermount3 for the power-loss tests' FUSE file system (tests/_powerloss_fs.py).
need=()
command -v java >/dev/null 2>&1 || need+=(openjdk-17-jre-headless)
command -v kcat >/dev/null 2>&1 || need+=(kcat)
command -v fusermount3 >/dev/null 2>&1 || need+=(fuse3)
if ((${#need[@]})); then
  sudo=""; [ "$(id -u)" = 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${need[@]}"
fi

python3 -m pip install -q --disable-pip-version-check -e '.[test,bench]'
# Editable installs build the kernels in place; fail loudly if one is missing.
# Two workers (the machine has 2 cores and most tests wait on brokers); a module stays on one
# worker so its broker fixtures start once. KBROKER_TEST_WORKERS=0 runs in one process.
KBROKER_REQUIRE_EXTENSIONS=1 python3 -m pytest -n "${KBROKER_TEST_WORKERS:-2}" --dist loadfile "$@"
