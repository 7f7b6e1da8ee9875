#!/usr/bin/env bash
# make-pcaps.sh [DEST] - regenerate the reference captures of real siw traffic
# (default DEST: ../../../testdata/siw-pcaps relative to this script, the
# repository's testdata/siw-pcaps).
#
#   lo-stock-*   selftest in one VM, stock siw, captured on lo (MTU 1500, TSO/GSO off)
#   eth-stock-*  two VMs on the bridge, stock siw on both, captured on the server's eth0
#                (server 10.77.0.2, client 10.77.0.4), i.e. real Ethernet frames
#   lo-crc-*     selftest, siw built with mpa_crc_required=true (MPA CRC32c on)
#   lo-p2p-*     selftest, siw built with peer_to_peer=true (MPA v2 P2P + RTR)
# Tests: rping (-C 5, 64 B), ib_{write,read,send}_bw -R -s 4096 -n 20.
# Also writes ANALYSIS.txt (analyze-pcap.sh) and logs/ (tool output, ibv_devinfo -v).
# Needs root; takes ~3 minutes.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
DEST=${1:-$HERE/../../../testdata/siw-pcaps}
CACHE=${SIWVM_CACHE:-/var/tmp/siw-vm-cache}
RUNS=$CACHE/runs/make-pcaps
mkdir -p "$DEST/logs"
DEST=$(cd "$DEST" && pwd)
"$HERE/build.sh"
rm -rf "$RUNS"; mkdir -p "$RUNS"

declare -A TOOL=([rping]=rping [write]=ib_write_bw [read]=ib_read_bw [send]=ib_send_bw)

collect() { # rundir prefix role(selftest|server|client) tests...
    local run=$1 pre=$2 role=$3; shift 3
    for t in "$@"; do
        cp "$run/$role-$t.pcap" "$DEST/$pre-${TOOL[$t]}.pcap"
        for side in server client; do
            f=$run/$role-$t-$side.log; [ "$role" != selftest ] && f=$run/$role-$t.log
            [ -f "$f" ] && cp "$f" "$DEST/logs/$pre-${TOOL[$t]}-$( [ "$role" = selftest ] && echo $side || echo $role).log"
        done
    done
    cp "$run/info.txt" "$DEST/logs/$pre-info.txt"
    cp "$run/results.txt" "$DEST/logs/$pre-results.txt"
}

selftest() { # variant prefix tests...
    local v=$1 pre=$2; shift 2
    for try in 1 2 3; do
        if "$HERE/boot.sh" --no-build --variant "$v" --tests "$*" --out "$RUNS/$pre" selftest >"$RUNS/$pre.log" 2>&1; then
            collect "$RUNS/$pre" "$pre" selftest "$@"; echo "[pcaps] $pre ok" >&2; return 0
        fi
        mv "$RUNS/$pre" "$RUNS/$pre-failed$try"; mv "$RUNS/$pre.log" "$RUNS/$pre-failed$try.log"
        echo "[pcaps] $pre failed (try $try), kept in $RUNS/$pre-failed$try" >&2
    done
    return 1
}

pair() { # variant prefix tests...
    local v=$1 pre=$2; shift 2
    for try in 1 2 3; do
        rm -rf "$RUNS/$pre-server" "$RUNS/$pre-client"
        "$HERE/boot.sh" --no-build --variant "$v" --wait 60 --out "$RUNS/$pre-server" server "$@" >"$RUNS/$pre-server.log" 2>&1 &
        local sp=$!
        sleep 1
        local crc=0 src=0
        "$HERE/boot.sh" --no-build --variant "$v" --ip 10.77.0.4 --tap sivm1 --wait 60 \
            --out "$RUNS/$pre-client" client 10.77.0.2 "$@" >"$RUNS/$pre-client.log" 2>&1 || crc=$?
        wait $sp || src=$?
        if [ $crc = 0 ] && [ $src = 0 ]; then
            collect "$RUNS/$pre-server" "$pre" server "$@"
            for t in "$@"; do cp "$RUNS/$pre-client/client-$t.log" "$DEST/logs/$pre-${TOOL[$t]}-client.log"; done
            echo "[pcaps] $pre ok" >&2; return 0
        fi
        for x in server client; do mv "$RUNS/$pre-$x" "$RUNS/$pre-$x-failed$try"; mv "$RUNS/$pre-$x.log" "$RUNS/$pre-$x-failed$try.log"; done
        echo "[pcaps] $pre failed (try $try), kept in $RUNS/$pre-*-failed$try" >&2
    done
    return 1
}

selftest stock lo-stock rping write read send
pair     stock eth-stock rping write read send
selftest crc   lo-crc   rping write read send
selftest p2p   lo-p2p   rping write

# keep one kernel/tool version record
grep -h -A7 '== siwvm-release' "$DEST/logs/lo-stock-info.txt" | tail -n +2 > "$DEST/logs/versions.txt"
"$HERE/analyze-pcap.sh" "$DEST"/*.pcap > "$DEST/ANALYSIS.txt" 2>&1
ls -la "$DEST" >&2
du -sh "$DEST" >&2
