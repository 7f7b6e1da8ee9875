# shellcheck shell=sh
# pyverbs scenario of the siw VM (sourced by siwvm.sh once siw0 is up; only
# the pyverbs initramfs has it: build.sh with SIWVM_PYVERBS=1, boot.sh
# --pyverbs). Runs rdma-core's Python test suite, run_tests.py from
# python3-pyverbs, verbosely on siw0 (port 1, GID index 0: the suite
# otherwise drops an iWARP GID, the MAC followed by zeros), as the user
# nobody or, with the scenario argument root, as root. Further arguments go
# to run_tests.py (test names, e.g. tests.test_cq). At most $WAIT seconds.
#
# The suite's CM tests find the device's address as on Linux: the interface
# in /sys/class/infiniband/<dev>/device/net/, then `ip -j addr show` of it.
# siw's device has no parent device, so no such directory, and those tests
# skip ("doesn't have net interface"). The scenario gives siw0 one, as
# capi's TestPyverbsSuite gives rdmatap's device one: a tmpfs over
# /sys/class/infiniband where siw0/ holds links to the device's sysfs files
# and device/net/eth0. The argument nonet leaves sysfs alone.
#   $OUT/pyverbs.log   the suite's output (stdout and stderr)
#   RESULT pyverbs PASS|FAIL  PASS when the suite ran to its end ("Ran N tests")
pyverbs_netdev() { # ibdev netdev
    d=$(readlink -f /sys/class/infiniband/$1) || return 1
    others=$(ls /sys/class/infiniband)
    mkdir -p /tmp/ibclass
    for o in $others; do ln -s "$(readlink -f /sys/class/infiniband/$o)" /tmp/ibclass/$o.real; done
    mount -t tmpfs tmpfs /sys/class/infiniband || { log "mount over /sys/class/infiniband failed"; return 1; }
    for o in $others; do [ $o = $1 ] || ln -s "$(readlink /tmp/ibclass/$o.real)" /sys/class/infiniband/$o; done
    mkdir -p /sys/class/infiniband/$1/device/net/$2
    for f in "$d"/*; do [ "$(basename "$f")" = device ] || ln -s "$f" /sys/class/infiniband/$1/; done
    log "gave $1 device/net/$2: $(ls /sys/class/infiniband/$1/device/net/)"
}

scn_pyverbs() {
    set -- $ARGS
    user=nobody
    netdev=1
    while :; do
        case ${1:-} in
            root|nobody) user=$1; shift ;;
            nonet) netdev=0; shift ;;
            *) break ;;
        esac
    done
    [ $netdev = 1 ] && pyverbs_netdev siw0 eth0
    dir=/siwvm/pyverbs/tests
    [ -f $dir/run_tests.py ] || { result pyverbs FAIL "no $dir/run_tests.py: boot the pyverbs initramfs (boot.sh --pyverbs)"; return; }
    cmd="cd $dir && exec /usr/bin/python3 run_tests.py -v --dev siw0 --port 1 --gid 0 $*"
    log "pyverbs as $user: $cmd (at most ${WAIT}s)"
    ts=$(now)
    if [ $user = root ]; then
        PYTHONUNBUFFERED=1 timeout "$WAIT" sh -c "$cmd" > $OUT/pyverbs.log 2>&1; rc=$?
    else
        PYTHONUNBUFFERED=1 timeout "$WAIT" su -s /bin/sh nobody -c "$cmd" > $OUT/pyverbs.log 2>&1; rc=$?
    fi
    summary=$(grep -E '^(Ran [0-9]+ tests? in|OK|FAILED)' $OUT/pyverbs.log | tr '\n' ' ')
    det="user=$user netdev=$netdev rc=$rc time=$(awk "BEGIN{print $(now)-$ts}")s $summary"
    grep -q '^Ran [0-9]* tests\{0,1\} in' $OUT/pyverbs.log && result pyverbs PASS $det || result pyverbs FAIL $det
}
