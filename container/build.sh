#!/usr/bin/env bash
# Builds the project's container image with podman, from a Debian base made here (no registry).
#
#   container/build.sh          install the tools if absent, make the base, build the image
#   container/build.sh tools    only install and configure podman, runc and mmdebstrap
#
# Steps, each skipped when its result is already there (so a rerun only rebuilds what changed):
#   1. apt-get install podman runc mmdebstrap;
#   2. podman's system configuration (a containers.conf drop-in): the runc runtime (crun fails
#      on some cgroup setups) and default ulimits a container may have without raising them;
#   3. the base: `mmdebstrap --variant=minbase bookworm` into $WORK/base.tar with the machine's
#      own Debian apt sources, imported as localhost/debian:bookworm-slim;
#   4. the build context in $WORK/context: the sources, constraints.txt, the machine's locally
#      added CA certificates and the torch wheel pinned by constraints.txt (the CPU build);
#   5. podman build (container/Containerfile) tagged $IMAGE.
#
# Settings (environment): IMAGE (localhost/psyche:latest), BASE_IMAGE (the base above; e.g. a
# CUDA image for the GPU variant), TORCH_INDEX_URL (empty: the staged CPU wheel; else the index
# the image installs torch from, e.g. https://download.pytorch.org/whl/cu128), MIRROR (the apt
# sources of the base: a URL or a sources file; default the machine's debian.sources), WORK
# (build/image). Needs root: it runs itself through sudo otherwise.
set -euo pipefail

cd "$(dirname "$0")/.."
if [ "$(id -u)" != 0 ]; then
    exec sudo --preserve-env=IMAGE,BASE_IMAGE,TORCH_INDEX_URL,MIRROR,WORK "$0" "$@"
fi

IMAGE=${IMAGE:-localhost/psyche:latest}
DEFAULT_BASE=localhost/debian:bookworm-slim
BASE_IMAGE=${BASE_IMAGE:-$DEFAULT_BASE}
TORCH_INDEX_URL=${TORCH_INDEX_URL:-}
WORK=${WORK:-build/image}
PODMAN_CONF=/etc/containers/containers.conf.d/50-psyche.conf

say() { echo "image: $*" >&2; }

install_tools() {
    local missing=()
    for tool in podman runc mmdebstrap; do
        command -v "$tool" >/dev/null 2>&1 || missing+=("$tool")
    done
    if [ ${#missing[@]} -gt 0 ]; then
        say "installing ${missing[*]} with apt-get"
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
    fi
}

configure_podman() {
    local wanted
    wanted=$(printf '%s\n' \
        '# Written by container/build.sh (psyche): crun fails on some cgroup setups, and a' \
        '# container may not raise its rlimits above these.' \
        '[containers]' \
        'default_ulimits = ["nofile=20000:20000", "nproc=32768:32768"]' \
        '[engine]' \
        'runtime = "runc"')
    if [ "$(cat "$PODMAN_CONF" 2>/dev/null)" != "$wanted" ]; then
        say "writing $PODMAN_CONF"
        mkdir -p "$(dirname "$PODMAN_CONF")"
        echo "$wanted" >"$PODMAN_CONF"
    fi
}

make_base() {
    if [ "$BASE_IMAGE" != "$DEFAULT_BASE" ] || podman image exists "$BASE_IMAGE"; then
        return
    fi
    mkdir -p "$WORK"
    if [ ! -f "$WORK/base.tar" ]; then
        local mirror=${MIRROR:-}
        if [ -z "$mirror" ] && [ -f /etc/apt/sources.list.d/debian.sources ]; then
            mirror=/etc/apt/sources.list.d/debian.sources
        fi
        say "making the bookworm minbase with mmdebstrap (${mirror:-its default mirror})"
        rm -f "$WORK/base.tar.part"
        mmdebstrap --quiet --variant=minbase --mode=root --format=tar bookworm \
            "$WORK/base.tar.part" ${mirror:+"$mirror"}
        mv "$WORK/base.tar.part" "$WORK/base.tar"
    fi
    say "importing $WORK/base.tar as $BASE_IMAGE"
    podman import --quiet "$WORK/base.tar" "$BASE_IMAGE" >/dev/null
}

# The torch wheel pinned by constraints.txt, fetched once into $WORK/wheels with this machine's
# pip settings (its find-links or indexes; the CPU index added) for the base's Python 3.11, and
# linked into the context.
stage_torch_wheel() {
    local context_wheels=$1 version wheel
    version=$(sed -n 's/^torch==\([^ ]*\).*/\1/p' constraints.txt)
    [ -n "$version" ] || { say "constraints.txt pins no torch version"; exit 1; }
    mkdir -p "$WORK/wheels"
    if ! compgen -G "$WORK/wheels/torch-$version[-+]*.whl" >/dev/null; then
        say "fetching the torch $version wheel"
        python3 -m pip download --quiet --retries 1 --no-deps --only-binary=:all: \
            --dest "$WORK/wheels" --platform manylinux_2_28_x86_64 --python-version 3.11 \
            --implementation cp --abi cp311 \
            --extra-index-url https://download.pytorch.org/whl/cpu "torch==$version"
    fi
    for wheel in "$WORK/wheels/torch-$version"[-+]*.whl; do
        ln "$wheel" "$context_wheels/" 2>/dev/null || cp "$wheel" "$context_wheels/"
    done
}

# The context: recreated at every build (podman's layer cache keys on its contents).
stage_context() {
    local context=$WORK/context
    say "staging the build context in $context"
    rm -rf "$context"
    mkdir -p "$context/src" "$context/certs" "$context/wheels"
    tar -c --exclude=__pycache__ --exclude='*.egg-info' --exclude='*.pyc' \
        common server client local_testnet pyproject.toml README.md | tar -x -C "$context/src"
    cp container/Containerfile constraints.txt pyproject.toml "$context/"
    if [ -d /usr/local/share/ca-certificates ]; then
        find /usr/local/share/ca-certificates -name '*.crt' -exec cp {} "$context/certs/" \;
    fi
    if [ -z "$TORCH_INDEX_URL" ]; then
        stage_torch_wheel "$context/wheels"
    fi
}

build_image() {
    local before after
    before=$(podman image inspect --format '{{.Id}}' "$IMAGE" 2>/dev/null || true)
    say "building $IMAGE from $BASE_IMAGE"
    podman build --network host --layers \
        --build-arg BASE_IMAGE="$BASE_IMAGE" --build-arg TORCH_INDEX_URL="$TORCH_INDEX_URL" \
        -t "$IMAGE" -f "$WORK/context/Containerfile" "$WORK/context"
    after=$(podman image inspect --format '{{.Id}}' "$IMAGE")
    # the image this build replaced, now untagged (kept while a container uses it)
    if [ -n "$before" ] && [ "$before" != "$after" ]; then
        podman rmi "$before" >/dev/null 2>&1 || true
    fi
    say "built $IMAGE ($(podman image inspect --format '{{.Size}}' "$IMAGE") bytes)"
}

install_tools
configure_podman
if [ "${1:-}" = tools ]; then
    exit 0
fi
make_base
stage_context
build_image
