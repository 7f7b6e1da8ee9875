#!/usr/bin/env bash
# boot.sh - boot the siw test VM under qemu (TCG) and run one scenario.
#
#   boot.sh [options] selftest                 rping + ib_{write,read,send}_bw -R inside the VM over siw
#   boot.sh [options] server [TEST...]         siw servers on 10.77.0.2, one after another, waiting
#                                              for a peer (tests: rping write read send write_lat ...)
#   boot.sh [options] client PEER_IP [TEST...] siw clients against PEER_IP (e.g. 10.77.0.3)
#   boot.sh [options] idle [SECONDS]           just bring siw0 up and sleep
#   boot.sh [options] shell                    interactive busybox shell on the console
#   boot.sh [options] --script FILE script     run FILE (sourced by the guest scenario runner)
#   boot.sh --pyverbs [options] pyverbs [root] [nonet] [TEST...]
#                                              rdma-core's Python tests (run_tests.py -v) on siw0,
#                                              as nobody (or root), into pyverbs.log; --wait bounds them;
#                                              nonet: siw0 without device/net (the CM tests skip)
#
# Options:
#   --ip A.B.C.D[/24]   guest address (default 10.77.0.2/24)
#   --tap NAME          host TAP for the VM NIC (default sivm0; use another per extra VM)
#   --mac MAC           default 52:54:00:4d:00:<last octet of ip, hex>
#   --out DIR           results dir (default $CACHE/runs/<time>-<scenario>-<ip>)
#   --variant V         siw build (see build.sh): fix (default: stock siw + rx-race fix) | stock (pristine)
#                       | crc | p2p | crc_p2p  (pristine + MPA CRC required / MPA v2 P2P-RTR offered)
#                       | crc_fix | p2p_fix | crc_p2p_fix
#   --iters N           rping iterations (5)        --size B  perftest message size (4096)
#   --n N               perftest iterations (20)    --wait S  server/client wait for peer (300)
#   --tests "a b"       test list for selftest (default "rping write read send")
#   --lomtu N           lo MTU in selftest (1500, so siw sizes FPDUs like on Ethernet)
#   --offload           keep virtio/lo TSO/GSO/GRO (default: off => wire-sized frames in captures)
#   --smp N (1)  --mem MB (1024)  --timeout S (1800, hard limit for qemu)
#   --pyverbs           boot the initramfs with python3 and pyverbs (build.sh with SIWVM_PYVERBS=1;
#                       --mem defaults to 2048)
#   --no-build          do not run build.sh first
#   --keep-tap          do not delete the VM's TAP on exit
# Exit status: 0 if every RESULT line is PASS.
# Needs root (TAP/bridge). Env SIWVM_CACHE as for build.sh.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
CACHE=${SIWVM_CACHE:-/var/tmp/siw-vm-cache}

IP=10.77.0.2/24 TAP=sivm0 MAC='' OUT='' VARIANT=fix ITERS=5 SIZE=4096 N=20 WAIT=300
TESTS='' LOMTU=1500 OFFLOAD=0 SMP=1 MEM='' TIMEOUT=1800 BUILD=1 KEEPTAP=0 SCRIPT='' PYVERBS=0
while [ $# -gt 0 ]; do
    case $1 in
        --ip) IP=$2; shift ;;
        --tap) TAP=$2; shift ;;
        --mac) MAC=$2; shift ;;
        --out) OUT=$2; shift ;;
        --variant) VARIANT=$2; shift ;;
        --iters) ITERS=$2; shift ;;
        --size) SIZE=$2; shift ;;
        --n) N=$2; shift ;;
        --wait) WAIT=$2; shift ;;
        --tests) TESTS=$2; shift ;;
        --lomtu) LOMTU=$2; shift ;;
        --offload) OFFLOAD=1 ;;
        --smp) SMP=$2; shift ;;
        --mem) MEM=$2; shift ;;
        --timeout) TIMEOUT=$2; shift ;;
        --no-build) BUILD=0 ;;
        --keep-tap) KEEPTAP=1 ;;
        --script) SCRIPT=$2; shift ;;
        --pyverbs) PYVERBS=1 ;;
        -h|--help) sed -n '2,/^set -e/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        --*) echo "unknown option $1" >&2; exit 2 ;;
        *) break ;;
    esac
    shift
done
SCN=${1:-selftest}; shift || true
SARGS=$(IFS=,; echo "$*")
case $IP in */*) ;; *) IP=$IP/24 ;; esac
ADDR=${IP%/*}
if [ -z "$MAC" ]; then MAC=$(printf '52:54:00:4d:00:%02x' "${ADDR##*.}"); fi
[ "$(id -u)" = 0 ] || { echo "boot.sh needs root (TAP/bridge)" >&2; exit 1; }

INITRD=$CACHE/initramfs.cpio.gz
if [ $PYVERBS = 1 ]; then
    INITRD=$CACHE/initramfs-pyverbs.cpio.gz
    [ -n "$MEM" ] || MEM=2048
    export SIWVM_PYVERBS=1
fi
[ -n "$MEM" ] || MEM=1024
if [ $BUILD = 1 ]; then "$HERE/build.sh"; fi
[ -f "$CACHE/vmlinuz" ] && [ -f "$INITRD" ] || { echo "run build.sh first (SIWVM_PYVERBS=1 for --pyverbs)" >&2; exit 1; }

if [ -z "$OUT" ]; then OUT=$CACHE/runs/$(date +%Y%m%d-%H%M%S)-$SCN-$ADDR; fi
mkdir -p "$OUT"; OUT=$(cd "$OUT" && pwd)
rm -f "$OUT"/results.txt
if [ -n "$SCRIPT" ]; then cp "$SCRIPT" "$OUT/scenario.sh"; fi

# network: bridge + this VM's tap
"$HERE/net.sh" add-tap "$TAP"
cleanup() {
    # stop our qemu (by its pidfile) if it is still running, then drop our tap
    if [ -s "$OUT/qemu.pid" ]; then
        p=$(cat "$OUT/qemu.pid")
        if [ -d "/proc/$p" ] && grep -q qemu "/proc/$p/comm" 2>/dev/null; then kill "$p" 2>/dev/null || true; sleep 1; fi
        rm -f "$OUT/qemu.pid"
    fi
    [ $KEEPTAP = 1 ] || "$HERE/net.sh" del-tap "$TAP"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

APPEND="console=ttyS0 panic=-1 loglevel=4 siwvm_scn=$SCN siwvm_ip=$IP siwvm_variant=$VARIANT"
APPEND+=" siwvm_iters=$ITERS siwvm_size=$SIZE siwvm_n=$N siwvm_wait=$WAIT siwvm_lomtu=$LOMTU siwvm_offload=$OFFLOAD"
[ -n "$SARGS" ] && APPEND+=" siwvm_args=$SARGS"
[ -n "$TESTS" ] && APPEND+=" siwvm_tests=$(echo "$TESTS" | tr ' ' '+')"

NICOPT=
if [ $OFFLOAD = 0 ]; then
    NICOPT=",csum=off,gso=off,guest_csum=off,guest_tso4=off,guest_tso6=off,guest_ecn=off,guest_ufo=off,host_tso4=off,host_tso6=off,host_ecn=off,host_ufo=off,mrg_rxbuf=off"
fi

echo "[boot] scenario=$SCN args='$*' ip=$IP tap=$TAP mac=$MAC variant=$VARIANT out=$OUT" >&2
T0=$(date +%s.%N)
STDIN=/dev/null; [ "$SCN" = shell ] && STDIN=/dev/stdin
set +e
timeout -k 10 "$TIMEOUT" qemu-system-x86_64 \
    -machine q35,accel=tcg -cpu max -smp "$SMP" -m "$MEM" \
    -nographic -no-reboot \
    -kernel "$CACHE/vmlinuz" -initrd "$INITRD" -append "$APPEND" \
    -netdev "tap,id=n0,ifname=$TAP,script=no,downscript=no" \
    -device "virtio-net-pci,netdev=n0,mac=$MAC$NICOPT${SIWVM_NICOPT:-}" \
    -device virtio-rng-pci \
    -virtfs "local,path=$OUT,mount_tag=hostshare,security_model=none,id=fs0" \
    -pidfile "$OUT/qemu.pid" \
    < $STDIN 2>&1 | tee "$OUT/console.log"
RC=${PIPESTATUS[0]}
set -e
T1=$(date +%s.%N)
ELAPSED=$(awk "BEGIN{printf \"%.1f\", $T1-$T0}")

# no 9p? recover files printed base64 on the console
if grep -q '^SIWVM-FILE-BEGIN' "$OUT/console.log"; then
    awk -v d="$OUT" '
        /^SIWVM-FILE-BEGIN/ {f=d "/" $2; sub(/\r$/,"",f); cmd="base64 -d > \"" f "\""; next}
        /^SIWVM-FILE-END/   {close(cmd); cmd=""; next}
        cmd != ""           {sub(/\r$/,""); print | cmd}' "$OUT/console.log"
fi
echo "[boot] qemu exit=$RC wall=${ELAPSED}s results in $OUT" >&2
echo "wall_seconds=$ELAPSED" > "$OUT/timing.txt"
if [ -f "$OUT/results.txt" ]; then
    cat "$OUT/results.txt"
    grep -q '^RESULT' "$OUT/results.txt" && ! grep -q ' FAIL ' "$OUT/results.txt" && exit 0
fi
exit 1
