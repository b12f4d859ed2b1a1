#!/bin/sh
# Runs bench/mt_post_poll.c against one or more builds of the library and prints, per
# operation and thread count, the median of REPS runs of messages/s (wall clock) and of
# messages per CPU-second of the process (less sensitive to other load); for the call
# modes (poll_empty, notify, recv_flush, wr_abort) library calls/s, calls per CPU-second
# and the process's voluntary context switches per run (threads blocking, e.g. on a lock).
#
# usage: crates/ffi/bench/run.sh LABEL=DIR [LABEL=DIR ...]
#   DIR holds a libibverbs.so.1 (a copy of target/release/liburoce_ffi.so).
# environment: THREADS (default "1 2 4"), MESSAGES per thread (default 100000),
#   OPS (default "send write wr_send wr_write"; the wr_* ones post through the ibv_wr_*
#   API, see mt_post_poll.c; the call modes take MESSAGES as iterations per thread),
#   SIZE (default 64), REPS (default 3),
#   UROCE_ADDR (default 127.0.0.90), CC (default cc).
# The builds alternate run by run, so that a load change on the machine hits both alike.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
threads=${THREADS:-"1 2 4"}
messages=${MESSAGES:-100000}
ops=${OPS:-"send write wr_send wr_write"}
size=${SIZE:-64}
reps=${REPS:-3}
addr=${UROCE_ADDR:-127.0.0.90}
exe=$(mktemp /tmp/mt_post_poll.XXXXXX)
trap 'rm -f "$exe" "$exe".*' EXIT
${CC:-cc} -O2 -std=gnu11 -Wall -Werror -o "$exe" "$here/mt_post_poll.c" -libverbs -lpthread
for op in $ops; do
  for t in $threads; do
    for r in $(seq "$reps"); do
      for spec in "$@"; do
        label=${spec%%=*}
        dir=${spec#*=}
        # A build without the operation (the ibv_wr_* modes before that API) fails: "fail".
        out=$(UROCE_ADDR=$addr LD_LIBRARY_PATH=$dir timeout 300 "$exe" "$t" "$messages" "$op" "$size") || true
        rate=$(echo "$out" | sed -n 's/.* \(msgs\|calls\)_per_s=\([0-9]*\).*/\2/p')
        cpu=$(echo "$out" | sed -n 's/.* \(msgs\|calls\)_per_cpu_s=\([0-9]*\).*/\2/p')
        grep -q '^CHECK ok$' <<EOF || rate= cpu=
$out
EOF
        vcs=$(echo "$out" | sed -n 's/.* vol_cs=\([0-9]*\).*/\1/p')
        echo "$label $op $t ${rate:-fail} ${cpu:-fail} ${vcs:--}" >> "$exe.runs"
      done
    done
  done
done
echo "op threads $(for spec in "$@"; do printf '%s:per-s %s:per-cpu-s %s:vol-cs ' "${spec%%=*}" "${spec%%=*}" "${spec%%=*}"; done)(medians of $reps; messages, or calls for the call modes; vol-cs: voluntary context switches per run, call modes only)"
for op in $ops; do
  for t in $threads; do
    line="$op $t"
    for spec in "$@"; do
      label=${spec%%=*}
      for col in 4 5 6; do
        med=$(awk -v l="$label" -v o="$op" -v t="$t" -v c="$col" '$1==l && $2==o && $3==t {print $c}' "$exe.runs" |
              sort -n | awk '{a[NR]=$1} END {print (NR ? a[int((NR+1)/2)] : "fail")}')
        line="$line $med"
      done
    done
    echo "$line"
  done
done
