# Guest side of test/interop's cells (boot.sh --script): sourced by the
# harness's siwvm.sh once siw0 is up, with its helpers (log, result,
# wait_listen, $OUT = the host's share, $PT_PORT).
#
# $OUT/plan.txt holds one cell a line, run in order:
#
#	server NAME TIMEOUT COMMAND...   start COMMAND (a perftest server), print
#	                                 "READY NAME" once it listens, wait for it
#	client NAME TIMEOUT COMMAND...   run COMMAND (a client of the host), again
#	                                 while it fails before it printed a result
#	                                 table (the host's server is not up yet),
#	                                 for at most TIMEOUT seconds
#	exec NAME TIMEOUT COMMAND...     run COMMAND once
#	daemon NAME TIMEOUT COMMAND...   start COMMAND (a server that serves until
#	                                 killed), print "READY NAME" once it
#	                                 listens, stop it when the host creates
#	                                 $OUT/NAME.stop; it passes if it was still
#	                                 running then
#
# The host may end any cell by creating $OUT/NAME.stop (its own side has
# failed): the command is killed, and the cell fails (but a daemon's).
#	port N                           the port later server and daemon cells
#	                                 wait for (default $PT_PORT, perftest's)
#	stderr split|join                later cells write their standard error to
#	                                 $OUT/NAME.err, or (default) with their
#	                                 output to $OUT/NAME.log
#	await NAME TIMEOUT               wait until the host creates $OUT/NAME.go
#	                                 (its server for the next cell listens),
#	                                 for at most TIMEOUT seconds
#	nicreset NAME                    reset the NIC (see plan_nic_reset)
#
# Each cell writes $OUT/NAME.log and "RESULT NAME PASS|FAIL rc=N time=S".
# With $OUT/pcap present each cell is captured (headers only) in NAME.pcap.
#
# After a cell that failed, the guest pings the host's bridge. No answer
# means the virtio NIC has stopped transmitting (qemu under TCG on a
# loaded host: see test/interop/README.md, "Known harness trouble"); the
# guest logs "NIC STALLED NAME", resets the NIC and brings siw0 back, so
# that the boot's later cells run on a working NIC instead of failing
# one after another. The failed cell stays failed.

PLAN_BRIDGE=${PLAN_BRIDGE:-10.77.0.1}
PLAN_PORT=$PT_PORT
PLAN_STDERR='join'

# plan_nic_reset NAME: unload and reload virtio_net (the driver's removal
# resets the device, and with it qemu's queues), then bring eth0 and siw0
# up as siwvm.sh's setup does. Logs "NIC RESET NAME ok|failed".
plan_nic_reset() {
	rdma link delete siw0 2>/dev/null
	ip link set eth0 down 2>/dev/null
	rmmod virtio_net && modprobe virtio_net
	i=0; while ! ip link show eth0 >/dev/null 2>&1 && [ $i -lt 50 ]; do sleep 0.1; i=$((i+1)); done
	ip link set eth0 mtu "$ETHMTU"
	if [ "$OFFLOAD" = 0 ]; then
		ethtool -K eth0 tso off gso off gro off >/dev/null 2>&1
	fi
	ip addr add "$IPCIDR" dev eth0
	ip link set eth0 up
	rdma link add siw0 type siw netdev eth0
	i=0; while [ ! -e /dev/infiniband/uverbs0 ] && [ $i -lt 50 ]; do sleep 0.1; i=$((i+1)); done
	if rdma link show siw0/1 >/dev/null 2>&1 && ping -c 3 -W 3 "$PLAN_BRIDGE" >/dev/null 2>&1; then
		log "NIC RESET $1 ok"
	else
		log "NIC RESET $1 failed"
	fi
}

# plan_nic_check NAME: after a failed cell, reset a NIC that no longer
# transmits.
plan_nic_check() {
	ping -c 3 -W 3 "$PLAN_BRIDGE" >/dev/null 2>&1 && return 0
	log "NIC STALLED $1"
	plan_nic_reset "$1"
}

plan_cap_start() {
	CAP_PID=
	[ -f "$OUT/pcap" ] || return 0
	tcpdump -Z root -i eth0 -s 160 -n -U -w "$OUT/$1.pcap" tcp > "$OUT/$1.tcpdump.log" 2>&1 &
	CAP_PID=$!
	i=0; while ! grep -q 'listening on' "$OUT/$1.tcpdump.log" 2>/dev/null && [ $i -lt 100 ]; do sleep 0.1; i=$((i+1)); done
}

plan_cap_stop() {
	[ -n "$CAP_PID" ] || return 0
	sleep 0.5; kill -INT $CAP_PID 2>/dev/null; wait $CAP_PID 2>/dev/null; CAP_PID=
}

# plan_start NAME TIMEOUT COMMAND...: start COMMAND in the background
# (pid in $sp), its output in $lg; with PLAN_STDERR=split its standard
# error in $OUT/NAME.err (a program that buffers its standard output,
# such as rping, then keeps its lines whole).
plan_start() {
	n=$1 l=$2; shift 2
	err=$lg; [ "$PLAN_STDERR" = split ] && err=$OUT/$n.err
	timeout "$l" "$@" < /dev/null > "$lg" 2> "$err" &
	sp=$!
}

# plan_wait NAME: wait for $sp to end, or for the host to create
# $OUT/NAME.stop (its side has failed, or it is done with a daemon); then
# $sp is stopped and $stopped is 1. rc is $sp's exit status.
plan_wait() {
	stopped=0
	while kill -0 $sp 2>/dev/null; do
		if [ -e "$OUT/$1.stop" ]; then
			stopped=1; kill $sp 2>/dev/null; break
		fi
		sleep 0.1
	done
	wait $sp; rc=$?
}

plan_cell() { # kind name timeout command...
	kind=$1 name=$2 lim=$3; shift 3
	lg=$OUT/$name.log; ts=$(now); tries=0
	plan_cap_start "$name"
	case $kind in
	server)
		plan_start "$name" "$lim" "$@"
		wait_listen $PLAN_PORT 60
		log "READY $name"
		plan_wait "$name"
		[ $stopped = 1 ] && log "STOPPED $name" ;;
	daemon)
		plan_start "$name" "$lim" "$@"
		wait_listen $PLAN_PORT 60
		log "READY $name"
		plan_wait "$name"
		# A daemon passes if it was still running when it was stopped.
		if [ $stopped = 1 ]; then rc=0; elif [ $rc = 0 ]; then rc=1; fi ;;
	client)
		deadline=$(( ${ts%.*} + lim ))
		while :; do
			tries=$((tries+1))
			plan_start "$name" "$lim" "$@"
			plan_wait "$name"
			[ $rc = 0 ] || [ $stopped = 1 ] && break
			grep -q '#bytes' "$lg" && break
			t1=$(now); [ ${t1%.*} -ge $deadline ] && break
			sleep 1
		done ;;
	*)
		plan_start "$name" "$lim" "$@"
		plan_wait "$name" ;;
	esac
	plan_cap_stop
	det="rc=$rc tries=$tries time=$(awk "BEGIN{print $(now)-$ts}")s"
	[ $rc = 0 ] && result "$name" PASS $det || result "$name" FAIL $det
	[ $rc = 0 ] || plan_nic_check "$name" < /dev/null
	log "DONE $name"
}

log "plan: $(grep -c . $OUT/plan.txt) cells"
while read -r kind name lim cmd; do
	[ -n "$kind" ] || continue
	case $kind in
	\#*) continue ;;
	nicreset) plan_nic_reset "$name" < /dev/null; continue ;;
	port) PLAN_PORT=$name; continue ;;
	stderr) PLAN_STDERR=$name; continue ;;
	await)
		i=0; while [ ! -e "$OUT/$name.go" ] && [ $i -lt $((lim * 10)) ]; do sleep 0.1; i=$((i+1)); done
		[ -e "$OUT/$name.go" ] && log "GO $name" || log "NO GO $name"
		continue ;;
	esac
	# shellcheck disable=SC2086 # the command's words
	plan_cell "$kind" "$name" "$lim" $cmd
done < "$OUT/plan.txt"
