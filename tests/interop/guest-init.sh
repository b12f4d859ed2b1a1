#!/bin/sh
# /init of the interop guest (busybox sh), written by tests/interop/interop.py into the
# initramfs. It brings up the kernel's Soft-RoCE device rxe0 on eth0, then sources the
# plan /plan.sh (a second, per-boot archive) which calls `serve` and `connect` below for
# each step of the run, and powers the guest off.
#
# Kernel command line: uroce.name=NAME uroce.ip=A.B.C.D/NN uroce.host=A.B.C.D
# Console protocol (lines the host side waits for; `@@` starts every marker):
#   @@NAME up gid=N            rxe0 is ACTIVE, N is the index of its RoCE v2 IPv4 GID
#   @@NAME step=K listen       the server of step K listens (a guest server)
#   @@NAME step=K rc=R         the program of step K exited with status R
#   @@NAME done                the plan has ended
#   @@NAME fail=WHY            set-up failed; the guest powers off
PATH=/usr/sbin:/usr/bin:/sbin:/bin
export PATH
mount -t proc none /proc
mount -t sysfs none /sys
mount -t devtmpfs none /dev
mkdir -p /dev/pts /dev/shm
mount -t devpts none /dev/pts
mount -t tmpfs none /dev/shm
mount -t tmpfs none /tmp

NAME=guest ADDR= HOST=
for word in $(cat /proc/cmdline); do
	case "$word" in
	uroce.name=*) NAME=${word#uroce.name=} ;;
	uroce.ip=*) ADDR=${word#uroce.ip=} ;;
	uroce.host=*) HOST=${word#uroce.host=} ;;
	esac
done
echo

off() {
	sync
	poweroff -f
	sleep 10
}
fail() {
	echo "@@$NAME fail=$1"
	off
}

# Modules in dependency order (the builder resolved it from the kernel package).
while read -r ko; do
	insmod "$ko" 2>/tmp/err || grep -q 'File exists' /tmp/err || fail "insmod-$ko:$(cat /tmp/err)"
done </etc/interop/modules

ip link set lo up
n=0
while [ ! -d /sys/class/net/eth0 ] && [ $n -lt 100 ]; do sleep 0.05; n=$((n + 1)); done
[ -d /sys/class/net/eth0 ] || fail no-eth0
# No IPv6 on the wire: only ARP and RoCEv2 go out.
echo 1 >/proc/sys/net/ipv6/conf/eth0/disable_ipv6
ip addr add "$ADDR" dev eth0
ip link set eth0 up
rdma link add rxe0 type rxe netdev eth0 || fail rdma-link-add

# rxe lists a link-local GID first; the one the peers use is ::ffff:<IPv4>, RoCE v2.
want=$(echo "${ADDR%/*}" | awk -F. '{printf "0000:0000:0000:0000:0000:ffff:%02x%02x:%02x%02x", $1, $2, $3, $4}')
port=/sys/class/infiniband/rxe0/ports/1
GID=
n=0
while [ -z "$GID" ] && [ $n -lt 200 ]; do
	if grep -q ACTIVE $port/state 2>/dev/null; then
		for g in $port/gids/*; do
			i=${g##*/}
			if [ "$(cat "$g" 2>/dev/null)" = "$want" ] &&
				[ "$(cat $port/gid_attrs/types/"$i" 2>/dev/null)" = "RoCE v2" ]; then
				GID=$i
			fi
		done
	fi
	[ -n "$GID" ] || sleep 0.05
	n=$((n + 1))
done
[ -n "$GID" ] || fail no-roce-v2-gid
ulimit -l unlimited
cd /tmp
echo "@@$NAME up gid=$GID kernel=$(uname -r)"

# serve K PORT SECONDS PROGRAM ARGS...: start the server of step K, say when it listens
# (PORT 0: a program that listens through rdma_cm, not TCP; give it a moment), wait for
# it and report its status.
serve() {
	step=$1 tcp=$2 secs=$3
	shift 3
	timeout "$secs" "$@" >/tmp/out.$step 2>&1 &
	pid=$!
	if [ "$tcp" = 0 ]; then
		sleep 1
	else
		hex=$(printf ':%04X ' "$tcp")
		n=0
		while [ $n -lt 400 ] && ! grep -q "$hex.* 0A " /proc/net/tcp /proc/net/tcp6 2>/dev/null; do
			sleep 0.05
			n=$((n + 1))
		done
	fi
	echo "@@$NAME step=$step listen"
	wait $pid
	report "$step" $?
}

# connect K SECONDS PROGRAM ARGS...: wait until the host opens the gate for step K (its
# server listens), then run the client.
connect() {
	step=$1 secs=$2
	shift 2
	n=0
	while [ $n -lt 1200 ]; do
		[ "$(wget -q -O - "http://$HOST:8790/gate" 2>/dev/null)" = "$step" ] && break
		sleep 0.1
		n=$((n + 1))
	done
	timeout "$secs" "$@" >/tmp/out.$step 2>&1
	report "$step" $?
}

report() {
	sed "s/^/[$NAME.$1] /" /tmp/out.$1
	echo "@@$NAME step=$1 rc=$2"
}

[ -f /plan.sh ] && . /plan.sh
echo "@@$NAME done"
off
