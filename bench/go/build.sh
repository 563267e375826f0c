#!/bin/sh
# Build the Go benchmark workers (bench/go/bin/go-nsq-worker, youzan-go-nsq-worker) that
# bench/compare runs as the clients go-nsq and youzan-go-nsq (skipped when not built).
#
# GOPATH mode (GO111MODULE=off: no module proxy): $GOPATH must hold, under src/github.com/,
# nsqio/go-nsq (v1.1.0), youzan/go-nsq (v1.7.2-HA), golang/snappy (v0.0.1) and pierrec/lz4
# (v2.4.1), checked out from their public repositories; none of them is part of this tree.
#   GOPATH=/tmp/gopath bench/go/build.sh
# Only what is in $GOPATH is built: a library that is missing skips its worker.
set -eu

here=$(cd "$(dirname "$0")" && pwd)
: "${GOPATH:?set GOPATH to the tree that holds the libraries (see this script)}"
export GOPATH GO111MODULE=off
mkdir -p "$GOPATH/src/smartnsqbench" "$here/bin"
# Our shared code, where GOPATH mode resolves its import path.
ln -sfn "$here/common" "$GOPATH/src/smartnsqbench/common"

build() { # worker directory, library, binary
    if [ ! -d "$GOPATH/src/github.com/$2" ]; then
        echo "bench/go: no github.com/$2 in $GOPATH/src: $3 not built" >&2
        return 0
    fi
    (cd "$here/$1" && go build -o "$here/bin/$3" .)
    echo "bench/go: built bin/$3 ($(go version | cut -d' ' -f3))" >&2
}
build gonsq nsqio/go-nsq go-nsq-worker
build youzan youzan/go-nsq youzan-go-nsq-worker
