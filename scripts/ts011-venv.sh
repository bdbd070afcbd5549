# Sourced by the TokenSpeed 0.1.1 interop scripts (interop-tokenspeed011.sh,
# interop-cachepd.sh): one pinned venv for both, BUILD/ts011-venv, from
# tests/interop/requirements-tokenspeed011.txt (every package pinned,
# --no-deps, no system packages); installed once, reinstalled when the pin
# list changes.
# ts011_venv NAME VENV REQS: 0 when VENV is ready; 1 (with a SKIPPED line
# naming NAME) when it is not set up and PyPI cannot be reached.
ts011_venv() {
    local name=$1 venv=$2 reqs=$3 want
    want=$(cat "$reqs")
    if [ -f "$venv/.interop-stamp" ] && [ "$(cat "$venv/.interop-stamp")" = "$want" ]; then
        return 0
    fi
    if ! timeout 20 /usr/bin/python3 -c \
        'import urllib.request; urllib.request.urlopen("https://pypi.org/simple/tokenspeed/", timeout=15)' \
        >/dev/null 2>&1; then
        echo "$name: SKIPPED: PyPI (pypi.org) is unreachable and $venv is not set up"
        return 1
    fi
    rm -rf "$venv"
    /usr/bin/python3 -m venv "$venv"
    "$venv/bin/python" -m pip install -q --disable-pip-version-check --no-deps -r "$reqs"
    printf '%s' "$want" >"$venv/.interop-stamp"
}
