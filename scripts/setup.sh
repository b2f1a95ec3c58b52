#!/usr/bin/env bash
# Installs what the project needs on a fresh machine, and nothing that is
# already there: safe to run again. `scripts/setup.sh --demo` (called by
# scripts/demo.sh) installs what the demo needs alone; `scripts/setup.sh`
# (called by scripts/test.sh and the benchmarks) everything.
#
# The demo's part:
# - Debian packages (only if missing): clang and libclang-dev (RocksDB's
#   build), protobuf-compiler (the worker's gRPC types), python3-venv where
#   the system Python lacks the venv module;
# - a project-local Python venv in .venv with requirements-demo.txt
#   (numpy, onnx, onnxruntime: the ONNX Runtime library the worker loads;
#   torch: the model tooling, about 5.6 GB and 90 s from PyPI).
#
# The test tooling besides:
# - the Rust toolchain's rustfmt and clippy components, cargo-deny
#   (`cargo install`, pinned) for the dependency policy in deny.toml, and
#   cargo-fuzz (pinned) for scripts/fuzz.sh;
# - Debian packages: redis-server and redis-tools (the tests start their
#   own servers), openssl (test TLS certificates), curl (the TLS test's
#   HTTPS client), wrk (scripts/bench-traces.sh's load), podman and runc
#   (the pod tests run the Kubernetes objects with `podman kube play`),
#   prometheus (promtool checks and unit-tests the alert rules; a real
#   server scrapes both daemons in a test), and kubernetes-client when no
#   kubectl is on the PATH (`kubectl kustomize` renders k8s/), iproute2
#   and util-linux (`ip`, `unshare`: the sandbox the docs' examples run in,
#   docs/examples.md);
# - the rest of requirements.txt in .venv (pyarrow, torch_geometric, the
#   Python client's gRPC, kubernetes-validate for the rendered manifests);
# - .venv-v2 with requirements-v2.txt: the Open Inference Protocol's
#   clients (tritonclient, the kserve SDK) the tests call the worker with.
#
# Each step says what it installs and how long it took.
set -euo pipefail
cd "$(dirname "$0")/.."

demo=0
case "${1:-}" in
    --demo) demo=1 ;;
    "") ;;
    *)
        echo "setup: unknown argument $1 (--demo: what scripts/demo.sh needs alone)" >&2
        exit 2
        ;;
esac

say() { printf 'setup [%ss]: %s\n' "$SECONDS" "$*"; }

CARGO_DENY_VERSION=0.18.6
CARGO_FUZZ_VERSION=0.13.2

if ! command -v cargo >/dev/null 2>&1; then
    echo "setup: cargo is not installed; install the Rust toolchain (rustup) first" >&2
    exit 1
fi
apt_updated=0
apt_install() {
    local missing=()
    for pkg in "$@"; do
        dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg")
    done
    [ ${#missing[@]} -eq 0 ] && return 0
    if [ "$apt_updated" = 0 ]; then
        say "apt-get update"
        apt-get update -qq
        apt_updated=1
    fi
    say "installing ${missing[*]}"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
}

apt_install clang libclang-dev protobuf-compiler
if [ "$demo" = 0 ]; then
    for component in rustfmt clippy; do
        if ! cargo "${component/rustfmt/fmt}" --version >/dev/null 2>&1; then
            say "adding the $component component"
            rustup component add "$component"
        fi
    done

    # cargo-deny checks the dependency policy (deny.toml) in scripts/test.sh.
    # Built from crates.io once (a few minutes), then found on the PATH.
    if ! cargo deny --version >/dev/null 2>&1; then
        say "installing cargo-deny $CARGO_DENY_VERSION (built once from crates.io)"
        cargo install --locked --quiet cargo-deny --version "$CARGO_DENY_VERSION"
    fi
    # cargo-fuzz builds and runs the fuzz targets (scripts/fuzz.sh); under a
    # minute to build.
    if ! cargo fuzz --version >/dev/null 2>&1; then
        say "installing cargo-fuzz $CARGO_FUZZ_VERSION (built once from crates.io)"
        cargo install --locked --quiet cargo-fuzz --version "$CARGO_FUZZ_VERSION"
    fi
    apt_install redis-server redis-tools openssl curl wrk podman runc prometheus iproute2 util-linux
    if ! command -v kubectl >/dev/null 2>&1; then
        apt_install kubernetes-client
    fi
fi

python=${PYTHON:-python3}
if ! command -v "$python" >/dev/null 2>&1; then
    apt_install python3 python3-venv
    python=python3
fi
if ! "$python" -c 'import venv, ensurepip' >/dev/null 2>&1; then
    apt_install python3-venv
fi

# free_mib PATH: the MiB free on PATH's filesystem, then its mount point.
free_mib() {
    local avail mount
    { read -r _; read -r _ _ _ avail _ mount; } < <(df -Pm "$1")
    echo "$avail $mount"
}

# room_for_torch DIR REQUIREMENTS: refuses, before pip starts, to install
# PyPI's torch (the CUDA build) where it cannot fit, instead of failing
# half-way with "No space left on device". Measured on 2026-12-07 (pip
# --no-cache-dir, requirements.txt into a new venv): the venv ends at
# 5,866 MiB and pip holds 2,981 MiB of wheels in TMPDIR until it has
# installed them all, 8,847 MiB at the peak; asked for: 5,900 and 3,000.
# A venv that already has torch skips it.
room_for_torch() {
    local dir=$1 requirements=$2
    compgen -G "$dir/lib/python3*/site-packages/torch" >/dev/null && return 0
    local tmp=${TMPDIR:-/tmp} venv_need=5900 wheels_need=3000
    local venv_free venv_mount tmp_free tmp_mount
    read -r venv_free venv_mount < <(free_mib "$dir")
    read -r tmp_free tmp_mount < <(free_mib "$tmp")
    local problem=""
    if [ "$venv_mount" = "$tmp_mount" ]; then
        if [ "$venv_free" -lt $((venv_need + wheels_need)) ]; then
            problem="$((venv_need + wheels_need)) MiB free on $venv_mount ($venv_need for torch's CUDA build in $dir, $wheels_need for its wheels in $tmp while pip installs); it has $venv_free"
        fi
    elif [ "$venv_free" -lt "$venv_need" ]; then
        problem="$venv_need MiB free on $venv_mount for torch's CUDA build in $dir; it has $venv_free"
    elif [ "$tmp_free" -lt "$wheels_need" ]; then
        problem="$wheels_need MiB free on $tmp_mount for torch's wheels in $tmp while pip installs; it has $tmp_free"
    fi
    if [ -n "$problem" ]; then
        echo "setup: installing $requirements into $dir needs about $problem." >&2
        echo "setup: free space there, or set TMPDIR to a filesystem with room for the wheels; nothing was installed." >&2
        exit 1
    fi
}

# venv DIR REQUIREMENTS [INCLUDED...]: creates the venv DIR if missing and
# installs REQUIREMENTS into it, again only when it or a file it includes
# changes (their sha256 is kept in DIR/.<requirements file>.sha256).
# pip keeps no cache (--no-cache-dir): a cached copy of torch's wheels
# would hold 3 GB more for as long as the machine lives.
venv() {
    local dir=$1 requirements=$2
    local stamp=$dir/.$(basename "$requirements").sha256
    local want
    want=$(cat "${@:2}" | sha256sum | cut -d' ' -f1)
    if [ ! -x "$dir/bin/python" ]; then
        say "creating the Python venv in $dir"
        "$python" -m venv "$dir"
    fi
    if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
        say "installing $requirements into $dir (pip's progress below)"
        case " ${*:2} " in
            *" requirements-demo.txt "*) room_for_torch "$dir" "$requirements" ;;
        esac
        "$dir/bin/python" -m pip install -q --no-cache-dir --upgrade pip
        "$dir/bin/python" -m pip install --no-cache-dir --progress-bar on -r "$requirements"
        echo "$want" >"$stamp"
        say "installed $requirements"
    fi
}
if [ "$demo" = 1 ]; then
    venv .venv requirements-demo.txt
    say "ready for the demo"
    exit 0
fi
venv .venv requirements.txt requirements-demo.txt
# The Open Inference Protocol's clients (tritonclient, kserve) need
# protobuf < 7: a venv of their own.
venv .venv-v2 requirements-v2.txt
say "ready"
