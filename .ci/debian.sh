# shellcheck shell=bash
# Sourced by the CI scripts that make Debian root filesystems (.ci/docker-engine for its base
# image, .ci/python for its trixie and sid roots): timing, Debian packages, debootstrap.
# The sourcing script defines `say MESSAGE` (progress on stderr).

now() { date +%s.%N; }
elapsed() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }

# apt-get install PACKAGES..., refreshing the package lists only when the install fails
# (they are usually fresh enough).
debian_install() {
    say "installing $* (Debian packages)"
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -q "$@" >/dev/null 2>&1 || {
        apt-get update -q >/dev/null
        apt-get install -y -q "$@" >/dev/null
    }
}

# Succeeds when something is mounted at or under DIR (never `rm -rf` such a directory: a bind
# mount would take its source with it).
mounted_under() {
    local dir
    dir=$(realpath -m "$1")
    awk -v d="$dir" '$5 == d || index($5, d "/") == 1 { found = 1 } END { exit !found }' \
        /proc/self/mountinfo
}

# debootstrap --variant=minbase SUITE into DIR (which must not exist or be empty), with the
# comma-separated packages INCLUDE, logging to LOG; on failure the end of the log goes to
# stderr, DIR is removed and the function fails.
debootstrap_minbase() {
    local suite=$1 dir=$2 include=$3 log=$4
    command -v debootstrap >/dev/null || debian_install debootstrap
    if ! debootstrap --variant=minbase --include="$include" "$suite" "$dir" \
        "${SMARTNSQ_DEBIAN_MIRROR:-http://deb.debian.org/debian}" >"$log" 2>&1; then
        say "debootstrap $suite failed; the end of $log:"
        tail -n 20 "$log" >&2
        mounted_under "$dir" || rm -rf "$dir"
        return 1
    fi
}
