#!/bin/sh
# Guest side of the siw qemu harness (runs under busybox ash as a child of /init).
#
# Configuration comes from the kernel command line (set by boot.sh):
#   siwvm_scn=selftest|server|client|idle|shell|script|pyverbs   scenario
#   siwvm_args=a,b,c       comma separated scenario arguments
#   siwvm_ip=10.77.0.2/24  eth0 address        siwvm_variant=stock|fix|crc|p2p|crc_p2p[_fix]
#   siwvm_iters=5          rping iterations    siwvm_size=4096  perftest msg size
#   siwvm_n=20             perftest iterations siwvm_wait=300   server/client wait (s)
#   siwvm_tests="rping write read send"  (use '+' instead of spaces on the cmdline)
#   siwvm_lomtu=1500       lo MTU for selftest  siwvm_offload=0  1 keeps TSO/GSO/GRO
#   siwvm_mtu=1500         eth0 MTU
# Results go to /host (9p share from the host, = boot.sh --out dir):
#   results.txt (RESULT lines), <test>.pcap, <test>-{server,client}.log, info.txt, dmesg.txt
# If 9p is unavailable files are printed base64 between SIWVM-FILE markers.
#
# busybox ash has ulimit -l; $(perf_args) is split into words on purpose.
# shellcheck disable=SC3045,SC2046

export PATH=/bin:/sbin:/usr/bin:/usr/sbin
ulimit -l unlimited 2>/dev/null

# ------------------------------------------------------------ config
getarg() { # name default
    v=$(tr ' ' '\n' < /proc/cmdline | sed -n "s/^$1=//p" | tail -1)
    [ -n "$v" ] && echo "$v" || echo "$2"
}
SCN=$(getarg siwvm_scn selftest)
ARGS=$(getarg siwvm_args "" | tr ',' ' ')
IPCIDR=$(getarg siwvm_ip 10.77.0.2/24)
ADDR=${IPCIDR%/*}
VARIANT=$(getarg siwvm_variant fix)
ITERS=$(getarg siwvm_iters 5)
PT_SIZE=$(getarg siwvm_size 4096)
PT_N=$(getarg siwvm_n 20)
WAIT=$(getarg siwvm_wait 300)
TESTS=$(getarg siwvm_tests "rping+write+read+send" | tr '+,' '  ')
LOMTU=$(getarg siwvm_lomtu 1500)
ETHMTU=$(getarg siwvm_mtu 1500)
OFFLOAD=$(getarg siwvm_offload 0)
RPING_PORT=7174
PT_PORT=18515

now() { cut -d' ' -f1 /proc/uptime; }
log() { echo "SIWVM: [$(now)] $*"; }

# ------------------------------------------------------------ output dir
OUT=/host
USE_9P=0
modprobe virtio_pci 2>/dev/null; modprobe 9pnet_virtio 2>/dev/null; modprobe 9p 2>/dev/null
i=0
while [ $i -lt 30 ]; do
    mount -t 9p -o trans=virtio,version=9p2000.L,msize=262144 hostshare /host 2>/dev/null && { USE_9P=1; break; }
    sleep 0.1; i=$((i+1))
done
if [ $USE_9P = 0 ]; then
    log "9p share not available, results will be printed base64 on the console"
    OUT=/tmp/out; mkdir -p $OUT
fi
: > $OUT/results.txt

result() { # name PASS|FAIL details...
    n=$1; s=$2; shift 2
    echo "RESULT $n $s $*" >> $OUT/results.txt
    log "RESULT $n $s $*"
}

# ------------------------------------------------------------ bring up
setup() {
    t0=$(now)
    for m in virtio_pci virtio_net virtio_rng crc32c_intel crc32c_generic libcrc32c \
             ib_core ib_uverbs iw_cm ib_cm rdma_cm rdma_ucm ib_umad; do
        modprobe $m 2>/dev/null || log "modprobe $m failed"
    done
    ko=/lib/siw/$VARIANT/siw.ko
    [ -f $ko ] || { log "unknown siw variant $VARIANT"; ko=/lib/siw/fix/siw.ko; }
    if ! insmod $ko; then
        log "insmod $ko FAILED"; dmesg | tail -20; return 1
    fi
    log "loaded siw variant $VARIANT"

    sysctl -qw net.ipv6.conf.all.disable_ipv6=1 net.ipv6.conf.default.disable_ipv6=1 2>/dev/null
    ip link set lo up
    i=0; while ! ip link show eth0 >/dev/null 2>&1 && [ $i -lt 50 ]; do sleep 0.1; i=$((i+1)); done
    ip link set eth0 mtu "$ETHMTU"
    if [ "$OFFLOAD" = 0 ]; then
        ethtool -K eth0 tso off gso off gro off >/dev/null 2>&1
    fi
    ip addr add "$IPCIDR" dev eth0
    ip link set eth0 up
    rdma link add siw0 type siw netdev eth0 || { log "rdma link add FAILED"; dmesg | tail; return 1; }
    i=0; while [ ! -e /dev/infiniband/uverbs0 ] && [ $i -lt 50 ]; do sleep 0.1; i=$((i+1)); done
    {
        echo "== siwvm-release"; cat /etc/siwvm-release
        echo "== uname"; uname -a
        echo "== cmdline"; cat /proc/cmdline
        echo "== siw variant: $VARIANT"
        echo "== ip addr"; ip addr
        echo "== ethtool -k eth0"; ethtool -k eth0 2>&1 | grep -E 'segmentation|receive-offload|checksum'
        echo "== rdma link"; rdma link
        echo "== rdma dev"; rdma dev
        echo "== ls /dev/infiniband"; ls -l /dev/infiniband
        echo "== ibv_devices"; ibv_devices
        echo "== ibv_devinfo -v"; ibv_devinfo -v
    } > $OUT/info.txt 2>&1
    rdma link | sed 's/^/SIWVM: /'
    log "siw ready in $(awk "BEGIN{print $(now)-$t0}")s (uptime $(now)s)"
}

# ------------------------------------------------------------ capture
CAP_PID=
cap_start() { # name iface [filter...]
    name=$1; ifc=$2; shift 2
    filt=${*:-tcp}
    tcpdump -Z root -i "$ifc" -s 0 -n -U -w "$OUT/$name.pcap" $filt > "$OUT/$name.tcpdump.log" 2>&1 &
    CAP_PID=$!
    i=0; while ! grep -q 'listening on' "$OUT/$name.tcpdump.log" 2>/dev/null && [ $i -lt 100 ]; do sleep 0.1; i=$((i+1)); done
}
cap_stop() {
    [ -n "$CAP_PID" ] || return 0
    sleep 1
    kill -INT $CAP_PID 2>/dev/null; wait $CAP_PID 2>/dev/null
    CAP_PID=
}

wait_listen() { # port [seconds]
    i=0; lim=$(( ${2:-30} * 10 ))
    while ! netstat -ltn 2>/dev/null | grep -q ":$1 " && [ $i -lt $lim ]; do sleep 0.1; i=$((i+1)); done
}

# ------------------------------------------------------------ tests
perf_tool() { # short name -> binary
    case $1 in
        write|read|send|atomic) echo ib_${1}_bw ;;
        write_lat|read_lat|send_lat|atomic_lat) echo ib_$1 ;;
        *) return 1 ;;
    esac
}
perf_args() { echo "-R -d siw0 -F -s $PT_SIZE -n $PT_N"; }
perf_numbers() { # logfile -> "header | values" of the result table
    awk '/#bytes/{h=$0; getline v; gsub(/  +/," ",h); gsub(/  +/," ",v); print h " =>" v; exit}' "$1"
}

rping_count() { grep -c 'ping data' "$1" 2>/dev/null; }

# run server and client inside the VM (selftest)
pair_test() { # test
    t=$1; sl=$OUT/selftest-$t-server.log; cl=$OUT/selftest-$t-client.log
    ts=$(now)
    if [ "$t" = rping ]; then
        timeout 120 rping -s -a $ADDR -v -C $ITERS > $sl 2>&1 &
        sp=$!; wait_listen $RPING_PORT
        timeout 120 rping -c -a $ADDR -v -C $ITERS > $cl 2>&1; crc=$?
        wait $sp; src=$?
        n=$(rping_count $cl)
        det="client_rc=$crc server_rc=$src ping_data_lines=$n/$ITERS time=$(awk "BEGIN{print $(now)-$ts}")s"
        [ $crc = 0 ] && [ $src = 0 ] && [ "$n" = "$ITERS" ] && result selftest-rping PASS $det || result selftest-rping FAIL $det
        return
    fi
    tool=$(perf_tool $t) || { result selftest-$t FAIL unknown-test; return; }
    timeout 300 $tool $(perf_args) > $sl 2>&1 &
    sp=$!; wait_listen $PT_PORT
    timeout 300 $tool $(perf_args) $ADDR > $cl 2>&1; crc=$?
    wait $sp; src=$?
    det="client_rc=$crc server_rc=$src time=$(awk "BEGIN{print $(now)-$ts}")s $(perf_numbers $cl)"
    [ $crc = 0 ] && [ $src = 0 ] && result selftest-$t PASS $det || result selftest-$t FAIL $det
}

scn_selftest() {
    ip link set lo mtu "$LOMTU"
    [ "$OFFLOAD" = 0 ] && ethtool -K lo tso off gso off >/dev/null 2>&1
    log "selftest over siw0 ($ADDR, traffic via lo mtu $LOMTU): $TESTS"
    for t in $TESTS; do
        cap_start selftest-$t lo tcp
        pair_test $t
        cap_stop
    done
}

# server side: wait for a peer (host-side implementation or another VM) per test
scn_server() {
    [ -n "$ARGS" ] && TESTS=$ARGS
    log "server on $ADDR, tests in order: $TESTS (each waits up to ${WAIT}s)"
    for t in $TESTS; do
        sl=$OUT/server-$t.log; ts=$(now)
        cap_start server-$t eth0 tcp
        if [ "$t" = rping ]; then
            timeout $WAIT rping -s -a $ADDR -v -C $ITERS > $sl 2>&1 &
            sp=$!; wait_listen $RPING_PORT
            log "READY rping server $ADDR:$RPING_PORT (rping -c -a $ADDR -v -C $ITERS)"
            wait $sp; rc=$?
            n=$(grep -c 'server ping data\|ping data' $sl)
            det="rc=$rc ping_data_lines=$n time=$(awk "BEGIN{print $(now)-$ts}")s"
        else
            tool=$(perf_tool $t) || { result server-$t FAIL unknown-test; cap_stop; continue; }
            timeout $WAIT $tool $(perf_args) > $sl 2>&1 &
            sp=$!; wait_listen $PT_PORT
            log "READY $tool server $ADDR:$PT_PORT ($tool $(perf_args) $ADDR)"
            wait $sp; rc=$?
            det="rc=$rc time=$(awk "BEGIN{print $(now)-$ts}")s $(perf_numbers $sl)"
        fi
        cap_stop
        [ $rc = 0 ] && result server-$t PASS $det || result server-$t FAIL $det
    done
}

# client side: connect to a peer; retries while the peer is not up yet
scn_client() {
    set -- $ARGS
    PEER=${1:-10.77.0.3}; shift
    [ $# -gt 0 ] && TESTS="$*"
    log "client of $PEER, tests in order: $TESTS"
    for t in $TESTS; do
        cl=$OUT/client-$t.log; ts=$(now); deadline=$(( ${ts%.*} + WAIT ))
        cap_start client-$t eth0 tcp
        tries=0
        while :; do
            tries=$((tries+1))
            if [ "$t" = rping ]; then
                # rping -c hangs after "connect error" (e.g. RST because the peer
                # is not listening yet): watch its output and retry instead
                rping -c -a $PEER -v -C $ITERS > $cl 2>&1 &
                rp=$!; i=0; rc=
                while kill -0 $rp 2>/dev/null; do
                    if grep -q -E 'connect error|rdma_connect|REJECTED|UNREACHABLE|ADDR_ERROR|ROUTE_ERROR' $cl; then
                        kill $rp 2>/dev/null; rc=111; break
                    fi
                    i=$((i+1)); [ $i -ge 1200 ] && { kill $rp 2>/dev/null; rc=124; break; }
                    sleep 0.1
                done
                wait $rp; r2=$?; [ -z "$rc" ] && rc=$r2
                n=$(rping_count $cl)
                [ $rc = 0 ] && break
                [ "$n" -gt 0 ] && break       # got data: a real failure, do not retry
                [ $rc = 124 ] && break        # connected but stalled: do not retry
            else
                tool=$(perf_tool $t) || { rc=99; break; }
                timeout 300 $tool $(perf_args) $PEER > $cl 2>&1; rc=$?
                [ $rc = 0 ] && break
                grep -q '#bytes' $cl && break
            fi
            t1=$(now); [ ${t1%.*} -ge $deadline ] && break
            sleep 2
        done
        cap_stop
        if [ "$t" = rping ]; then
            det="rc=$rc tries=$tries ping_data_lines=$n/$ITERS time=$(awk "BEGIN{print $(now)-$ts}")s"
            [ $rc = 0 ] && [ "$n" = "$ITERS" ] && result client-$t PASS $det || result client-$t FAIL $det
        else
            det="rc=$rc tries=$tries time=$(awk "BEGIN{print $(now)-$ts}")s $(perf_numbers $cl)"
            [ $rc = 0 ] && result client-$t PASS $det || result client-$t FAIL $det
        fi
        sleep 1
    done
}

# ------------------------------------------------------------ main
T_START=$(now)
log "scenario=$SCN args='$ARGS' ip=$IPCIDR variant=$VARIANT"
if ! setup; then
    result setup FAIL "siw bring-up failed"
else
    result setup PASS "siw0 on eth0 $IPCIDR variant=$VARIANT"
    case $SCN in
        selftest) scn_selftest ;;
        server)   scn_server ;;
        client)   scn_client ;;
        idle)     log "idle for ${ARGS:-3600}s"; sleep ${ARGS:-3600} ;;
        shell)    log "interactive shell; 'exit' powers off"; setsid cttyhack sh -l ;;
        pyverbs)  if [ -f /siwvm/pyverbs.sh ]; then . /siwvm/pyverbs.sh; scn_pyverbs
                  else result pyverbs FAIL "no /siwvm/pyverbs.sh: boot the pyverbs initramfs (boot.sh --pyverbs)"; fi ;;
        script)   if [ -f /host/scenario.sh ]; then log "running /host/scenario.sh"; . /host/scenario.sh
                  else result script FAIL "no /host/scenario.sh"; fi ;;
        *)        result scenario FAIL "unknown scenario $SCN" ;;
    esac
fi
dmesg > $OUT/dmesg.txt 2>&1
log "scenario $SCN finished after $(awk "BEGIN{print $(now)-$T_START}")s (uptime $(now)s)"
echo "SIWVM-RESULTS-BEGIN"
cat $OUT/results.txt
echo "SIWVM-RESULTS-END"
FAILED=0; grep -q ' FAIL ' $OUT/results.txt 2>/dev/null && FAILED=1
if [ $USE_9P = 0 ]; then
    for f in $OUT/*; do
        echo "SIWVM-FILE-BEGIN $(basename $f)"
        base64 $f
        echo "SIWVM-FILE-END"
    done
else
    sync; umount /host 2>/dev/null
fi
exit $FAILED
