# shellcheck shell=bash
# The install step shared by jobs/quickstart.sh and jobs/test.sh. Source it; it defines functions only.
#
# Environment:
#   G3_VENV           the virtual environment to create or reuse (default: <repo>/.venv; relative to the current
#                     directory, made absolute)
#   G3_BASE_PYTHON    the Python that creates it (default: python3 on PATH; 3.11 or newer: tomllib)
#   G3_TORCH_SPEC     the torch requirement installed first (default torch==2.13.0), pinned so that resolving
#                     the package never picks a torch itself. The build is the pip index's choice (PyPI alone:
#                     the multi-GB CUDA build on Linux); for CPU wheels from another index or a site build set
#                     this and/or G3_PIP_ARGS, e.g.
#                     G3_PIP_ARGS="--extra-index-url https://download.pytorch.org/whl/cpu".
#   G3_PIP_ARGS       extra arguments for every pip install (word-split)

# g3_venv_install REPO EXTRAS: create or reuse the venv, install torch, then the package (editable, with EXTRAS
# such as "test"; empty for none). Sets G3_VENV and G3_PY.
g3_venv_install() {
    local repo=$1 extras=${2:-} base spec
    G3_VENV=${G3_VENV:-$repo/.venv}
    # absolute: the callers change directory afterwards (quickstart to its work directory, test.sh to the
    # repository) and the install check runs from /, so a relative G3_VENV would name another place
    [[ $G3_VENV == /* ]] || G3_VENV=$PWD/$G3_VENV
    base=${G3_BASE_PYTHON:-python3}
    if [[ -x $G3_VENV/bin/python ]] && "$G3_VENV/bin/python" -m pip --version >/dev/null 2>&1; then
        echo "== reusing the virtual environment $G3_VENV"
    else
        command -v "$base" >/dev/null 2>&1 || { echo "error: $base not found (set G3_BASE_PYTHON)" >&2; return 1; }
        "$base" -c 'import sys; sys.exit(sys.version_info < (3, 11))' ||
            { echo "error: $base is Python $("$base" -c 'import platform; print(platform.python_version())');" \
                   "g3mpi needs 3.11 or newer (set G3_BASE_PYTHON)" >&2; return 1; }
        echo "== creating the virtual environment $G3_VENV with $base"
        if ! "$base" -m venv "$G3_VENV"; then
            # Debian's python3 lacks ensurepip until python3-venv is installed
            if [[ $(id -u) == 0 ]] && command -v apt-get >/dev/null 2>&1; then
                g3_apt_install python3-venv && rm -rf "$G3_VENV" && "$base" -m venv "$G3_VENV" || return 1
            else
                echo "error: '$base -m venv' failed (on Debian/Ubuntu: apt-get install python3-venv)" >&2
                return 1
            fi
        fi
    fi
    G3_PY=$G3_VENV/bin/python
    spec=${G3_TORCH_SPEC:-torch==2.13.0}
    # the install is editable, so only a change of setup.py, extras, torch spec or pip arguments needs pip again
    local stamp_file=$G3_VENV/.g3mpi-install stamp
    stamp=$(cat "$repo/setup.py" <(printf '%s\n' "$repo" "$extras" "$spec" "${G3_PIP_ARGS:-}") |
        sha256sum | cut -d' ' -f1)
    if [[ -f $stamp_file && $(<"$stamp_file") == "$stamp" ]] &&
        (cd / && "$G3_PY" -c 'import torch, mpi4py, h5py, pymetis, g3mpi, data_tools') >/dev/null 2>&1; then
        echo "== g3mpi already installed in $G3_VENV (setup.py unchanged)"
        return 0
    fi
    rm -f "$stamp_file"
    # torch first, exactly pinned, so that resolving the package below never chooses a torch (and CUDA) itself
    echo "== pip install $spec"
    # shellcheck disable=SC2086
    "$G3_PY" -m pip install -q ${G3_PIP_ARGS:-} "$spec" || { echo "error: pip install $spec failed" >&2; return 1; }
    echo "== pip install -e $repo${extras:+[$extras]}"
    # shellcheck disable=SC2086
    "$G3_PY" -m pip install -q ${G3_PIP_ARGS:-} -e "$repo${extras:+[$extras]}" ||
        { echo "error: pip install -e $repo${extras:+[$extras]} failed" >&2; return 1; }
    "$G3_PY" -c 'import torch, mpi4py, h5py, pymetis
print("== torch", torch.__version__, "| mpi4py", mpi4py.__version__, "| h5py", h5py.__version__)' ||
        return 1
    echo "$stamp" >"$stamp_file"
}

# g3_apt_install PKG...: install Debian packages if missing (root and apt-get only); status 1 if impossible
g3_apt_install() {
    local missing=() p
    for p in "$@"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
    done
    ((${#missing[@]})) || return 0
    if [[ $(id -u) != 0 ]] || ! command -v apt-get >/dev/null 2>&1; then
        echo "== not installing ${missing[*]}: needs root and apt-get (the tests that need them will skip)" >&2
        return 1
    fi
    echo "== apt-get install ${missing[*]}"
    local log
    log=$(mktemp)
    if ! DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${missing[@]}" >"$log" 2>&1; then
        DEBIAN_FRONTEND=noninteractive apt-get update -q >>"$log" 2>&1 || true
        if ! DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${missing[@]}" >>"$log" 2>&1; then
            tail -n 20 "$log" >&2
            echo "== apt-get install ${missing[*]} failed (the tests that need them will skip)" >&2
            rm -f "$log"
            return 1
        fi
    fi
    rm -f "$log"
}
