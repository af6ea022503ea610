#!/usr/bin/env bash
# Install what the tests need into .venv and run the whole suite (the README's test command).
set -euo pipefail
cd "$(dirname "$0")/.."

# The report test opens the HTML report in headless Chromium (Debian packages chromium, chromium-driver).
install_chromium() {
    local sudo=""
    if [ "$(id -u)" != 0 ]; then
        command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null || return 1
        sudo="sudo -n"
    fi
    command -v apt-get >/dev/null 2>&1 || return 1
    echo "installing Chromium (apt: chromium, chromium-driver and ~130 dependencies) for the report's browser test;" \
         "log in $log"
    $sudo apt-get update -qq >"$log" 2>&1 &&
        DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq chromium chromium-driver >>"$log" 2>&1
}
if ! command -v chromium >/dev/null 2>&1; then
    log="$(mktemp -t poolsim-chromium-install.XXXXXX.log)"
    if ! install_chromium; then
        [ -s "$log" ] && tail -n 5 "$log" >&2
        echo "!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!" >&2
        echo "WARNING: could not install Chromium (apt-get install -y chromium chromium-driver" >&2
        echo "failed, or no apt/root). The report's browser test will be SKIPPED." >&2
        echo "!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!" >&2
    fi
fi
python3 -m venv .venv
. .venv/bin/activate
python -m pip install -q --upgrade pip
# The CPU build of torch first: an unpinned torch would pull a multi-GB CUDA build.
python -m pip install -q torch==2.13.0 triton==3.9.0
python -m pip install -q -e ".[gpu,test]"
python -m pytest -rs "$@"
