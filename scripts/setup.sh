#!/usr/bin/env bash
# Set up a development/CI environment: the package with its test extras (CPU build of torch,
# triton for its interpreter), and Debian's chromium for the dashboard's browser test when we
# are root on a Debian-like system (the browser test skips without it).
set -euo pipefail
cd "$(dirname "$0")/.."
pip install torch==2.13.0 -e ".[test]"
if command -v chromium >/dev/null 2>&1; then
    echo "chromium: $(command -v chromium)"
elif [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    apt-get update -qq && apt-get install -y -qq chromium >/dev/null
    echo "chromium: installed $(chromium --version 2>/dev/null || true)"
else
    echo "chromium not installed (not root or no apt-get): the dashboard browser test will skip"
fi
