#!/usr/bin/env bash
# Many nodes on one machine (docs/multinode.md): two "hosts" made of network + UTS namespaces
# joined by a veth pair on a private subnet (no route out), Open MPI's remote launch through
# launch/netns-agent.sh instead of ssh, the real model and the demo request:
#   multinode_test.sh BIN MPIEXEC CASE
# CASE: kv      - `mpirun --host A,B` (one rank per host) of infoflow, exchange kv, equals a
#                 local `mpirun -np 2` of the same request: answer, selected positions,
#                 first-token logits, bytes per phase and rank; the result's placement names
#                 host A for rank 0 and host B for rank 1, both node-local rank 0 of 1
#       exact   - the same for infoflow with exchange exact
#       ring    - the same for ring attention
#       np4     - two ranks per host: node-local ranks 0/1 on each host, and the run equals
#                 the one-host 4-rank run
#       kill    - kill -9 of the rank on host B (while it is in recompute) ends the job
#                 non-zero with a message naming that rank; nothing is left behind
#       cutlink - the link between the hosts goes down while both ranks are in recompute: the
#                 application's deadline (parallel.timeout_s) ends every rank within timeout +
#                 10 s with a message naming the unreachable rank (each rank names the
#                 other); nothing is left behind
#       cutlink_hung - the same, and host B's Open MPI daemon is stopped as well: rank 1's
#                 MPI_Abort cannot return, its bounded abort (a 2 s hard exit) ends it
# Exits 77 (skipped) where network namespaces cannot be made (not root, no `ip`, or the
# kernel refuses). Everything made (namespaces, veth ends, processes) is removed on exit, also
# on failure.
set -uo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/../clock.sh"
bin="$(realpath "$1")"; mpiexec="$2"; case_name="$3"
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$root"
agent="$root/launch/netns-agent.sh"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_mpi_yield_when_idle=1
export OMP_WAIT_POLICY=passive INFOFLOW_PROGRESS=0
fail() { echo "FAIL: $*"; exit 1; }
skip() { echo "SKIPPED: $*"; exit 77; }

# ---- the two hosts ----
id="$$$(date +%N | cut -c1-3)"
nsA="ifspA$id" nsB="ifspB$id"           # also their host names
vethA="ifa$id" vethB="ifb$id"           # <= 15 characters
subnet=10.77.9
addrA=$subnet.2 addrB=$subnet.3
tmp="$(mktemp -d)"
made=()
cleanup() {
    local ns p
    for ns in "${made[@]}"; do
        for p in $(ip netns pids "$ns" 2>/dev/null); do kill -KILL "$p" 2>/dev/null; done
        ip netns del "$ns" 2>/dev/null
    done
    rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 1' INT TERM

[ "$(id -u)" -eq 0 ] || skip "not root: network namespaces need CAP_SYS_ADMIN and CAP_NET_ADMIN"
command -v ip >/dev/null && command -v unshare >/dev/null || skip "no ip or unshare command"
for ns in "$nsA" "$nsB"; do
    ip netns add "$ns" 2> "$tmp/netns.err" || skip "ip netns add refused: $(cat "$tmp/netns.err")"
    made+=("$ns")
done
ip link add "$vethA" netns "$nsA" type veth peer name "$vethB" netns "$nsB" \
    || fail "cannot make the veth pair"
ip -n "$nsA" addr add "$addrA/24" dev "$vethA" && ip -n "$nsB" addr add "$addrB/24" dev "$vethB" \
    && ip -n "$nsA" link set "$vethA" up && ip -n "$nsB" link set "$vethB" up \
    && ip -n "$nsA" link set lo up && ip -n "$nsB" link set lo up || fail "cannot set up the veth pair"
# When a link dies, the ranks end by their own deadline (the watchdog); Open MPI's daemons
# (mpirun, orted) end once TCP gives up on their connections over that link. With Linux's
# default of 15 retransmissions that takes about 15 minutes; the test's hosts give up after 5
# (about 13 s after the first unanswered packet): later than the ranks' deadline (5 s, plus 3 s
# of survey and 2 s of MPI_Abort), so that the deadline, not a failing socket, ends the ranks.
for ns in "$nsA" "$nsB"; do
    ip netns exec "$ns" sysctl -qw net.ipv4.tcp_retries2=5 || fail "cannot set tcp_retries2 in $ns"
done
# No default route in either namespace: nothing can leave the test subnet.
ip -n "$nsA" route | grep -q default && fail "namespace $nsA has a default route"
export INFOFLOW_NETNS_MAP="$addrA=$nsA $addrB=$nsB"
echo "hosts: $nsA ($addrA) and $nsB ($addrB), veth $vethA <-> $vethB"

model="$root/models/SmolLM2-135M-Instruct.Q4_1.gguf"
[ -f "$model" ] || fail "model file $model missing (run launch/setup.sh)"
# The demo request with a shorter answer (8 tokens are enough to compare decoding).
common=(--config configs/demo.toml --set model.threads=1 --set decode.max_new_tokens=8)
net=(--bind-to none --oversubscribe --mca plm_rsh_agent "$agent"
     --mca btl_tcp_if_include $subnet.0/24 --mca oob_tcp_if_include $subnet.0/24)

# local NP OUT ARGS...: the one-host reference run.
local_run() {
    local np=$1 out=$2
    shift 2
    timeout -k 5 300 "$mpiexec" -n "$np" --bind-to none --oversubscribe "$bin" "${common[@]}" \
        "$@" --out "$out" > "$out.txt" 2>&1 || { cat "$out.txt"; fail "local run ($*) failed"; }
}
# hosts HOSTSPEC NP OUT ARGS...: the same run across the two hosts, mpirun itself on host A.
hosts_run() {
    local spec=$1 np=$2 out=$3
    shift 3
    timeout -k 5 300 "$agent" "$nsA" "$mpiexec" -n "$np" --host "$spec" "${net[@]}" \
        "$bin" "${common[@]}" "$@" --out "$out" > "$out.txt" 2>&1 \
        || { cat "$out.txt"; fail "two-host run ($*) failed"; }
}
# same LOCAL.json HOSTS.json LOCAL_SIZE: the checks of one pair of runs.
same() {
    python3 - "$1" "$2" "$3" "$nsA" "$nsB" <<'PY' || exit 1
import json, socket, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
per_host, ns_a, ns_b = int(sys.argv[3]), sys.argv[4], sys.argv[5]
what = b["method"] + ("" if b["method"] == "ring" else " exchange " +
                     b["config"]["parallel"]["exchange"]) + f" on {b['ranks']} ranks"
for k in ["ranks", "answer", "selected_positions", "first_token_top", "context_tokens"]:
    assert a[k] == b[k], f"{what}: {k} differs: local {a[k]!r} vs two hosts {b[k]!r}"
pa = {p["name"]: (p["bytes_sent"], p["bytes_recv"]) for p in a["phases"]}
pb = {p["name"]: (p["bytes_sent"], p["bytes_recv"]) for p in b["phases"]}
assert pa == pb, f"{what}: bytes per phase differ: local {pa} vs two hosts {pb}"
assert sum(sum(s) for s, _ in pb.values()) > 0, f"{what}: no bytes moved"
# Where each rank ran: ranks [0, per_host) on host A, the others on host B.
n = b["ranks"]
pl = b["placement"]
assert [p["rank"] for p in pl] == list(range(n)), pl
for p in pl:
    host = ns_a if p["rank"] < per_host else ns_b
    assert p["host"] == host, f"{what}: rank {p['rank']} ran on {p['host']!r}, not {host!r}"
    assert p["local_rank"] == p["rank"] % per_host and p["local_size"] == per_host, p
    assert p["device"] == b["devices"][p["rank"]], p
assert {p["host"] for p in a["placement"]} == {socket.gethostname()}, a["placement"]
assert [p["local_rank"] for p in a["placement"]] == list(range(n)), a["placement"]
print(f"ok: {what}: answer {b['answer']['text']!r}, {len(b['selected_positions'])} selected, "
      f"logits and bytes per phase identical; placement",
      ", ".join(f"{p['rank']}@{p['host']}/{p['local_rank']}" for p in pl))
PY
}

# A job's processes: everything in the namespaces, and every infoflow_sp writing under $tmp.
leftovers() {
    { ip netns pids "$nsA"; ip netns pids "$nsB"; pgrep -f -- "--out $tmp/" ; } 2>/dev/null | sort -u
}
# wait_gone LIMIT: waits up to LIMIT s until leftovers is empty; fails naming what is left.
wait_gone() {
    local left=""
    for _ in $(seq 1 $(($1 * 10))); do
        left=$(leftovers)
        [ -z "$left" ] && return 0
        sleep 0.1
    done
    ps -o pid,stat,etime,args -p "$(echo $left | tr ' ' ',')"
    cat "$tmp"/*.txt
    fail "processes left behind: $(echo $left)"
}
# stopped_rank_pid NS: the pid of the infoflow_sp rank in namespace NS once it has stopped
# itself (INFOFLOW_INJECT_FAULT=...:stop, state T); waits up to 120 s.
stopped_rank_pid() {
    local ns=$1 p
    for _ in $(seq 1 1200); do
        for p in $(ip netns pids "$ns" 2>/dev/null); do
            if [ "$(ps -o comm= -p "$p" 2>/dev/null)" = "infoflow_sp" ] &&
                [ "$(ps -o stat= -p "$p" 2>/dev/null | cut -c1)" = "T" ]; then
                echo "$p"; return 0
            fi
        done
        sleep 0.1
    done
    return 1
}

case "$case_name" in
kv | exact | ring)
    method=infoflow exchange=$case_name
    [ "$case_name" = ring ] && method=ring exchange=kv
    args=(--set method.name=$method --set parallel.exchange=$exchange)
    t0=$(mono_s)
    local_run 2 "$tmp/local.json" "${args[@]}"
    t1=$(mono_s)
    hosts_run "$addrA,$addrB" 2 "$tmp/hosts.json" "${args[@]}"
    t2=$(mono_s)
    same "$tmp/local.json" "$tmp/hosts.json" 1
    python3 -c "print(f'   local run {$t1 - $t0:.1f} s, two-host run {$t2 - $t1:.1f} s')"
    grep -E "^placement" "$tmp/hosts.json.txt" || fail "no placement line in the run summary"
    grep -qE "^placement  : 2 hosts: $nsA rank 0 \(local 0 of 1\); $nsB rank 1 \(local 0 of 1\)$" \
        "$tmp/hosts.json.txt" || fail "the placement line does not name both hosts"
    wait_gone 5
    ;;
np4)
    local_run 4 "$tmp/local.json"
    hosts_run "$addrA:2,$addrB:2" 4 "$tmp/hosts.json"
    same "$tmp/local.json" "$tmp/hosts.json" 2
    grep -E "^placement" "$tmp/hosts.json.txt" || fail "no placement line in the run summary"
    grep -qE "^placement  : 2 hosts: $nsA ranks 0,1 \(local 0,1 of 2\); $nsB ranks 2,3 \(local 0,1 of 2\)$" \
        "$tmp/hosts.json.txt" || fail "the placement line does not name both hosts"
    wait_gone 5
    ;;
kill)
    INFOFLOW_INJECT_FAULT="1:recompute:stop" timeout -k 5 120 "$agent" "$nsA" "$mpiexec" -n 2 \
        --host "$addrA,$addrB" "${net[@]}" -x INFOFLOW_INJECT_FAULT "$bin" "${common[@]}" \
        --out "$tmp/r.json" > "$tmp/out.txt" 2>&1 &
    job=$!
    victim=$(stopped_rank_pid "$nsB") || { cat "$tmp/out.txt"; fail "rank 1 never reached recompute"; }
    t0=$(mono_s)
    kill -KILL "$victim"
    wait "$job"
    rc=$?
    took=$(python3 -c "print(round($(mono_s) - $t0, 1))")
    cat "$tmp/out.txt"
    [ "$rc" -ne 0 ] || fail "the job exited 0 after its rank 1 was killed"
    # mpirun itself exits 137 (128 + the signal of the killed rank): tell a hang by the time.
    [ "$rc" -ne 124 ] || fail "the job hung (ended by the test's timeout)"
    python3 -c "import sys; sys.exit(0 if $took <= 30 else 1)" \
        || fail "the job took $took s to end after the kill (limit 30 s)"
    grep -qE "process rank 1 .*on node $addrB exited on signal 9" "$tmp/out.txt" \
        || fail "no message naming rank 1 on host B"
    wait_gone 10
    [ ! -e "$tmp/r.json" ] || fail "--out written by a failed job"
    echo "ok: rank 1 (pid $victim on $nsB) killed in recompute; job ended rc=$rc after $took s"
    ;;
cutlink | cutlink_hung)
    timeout_s=5
    # --output-filename: each rank's output goes to a file written on its own host, so rank 1's
    # message is seen although host B cannot forward it to mpirun any more.
    INFOFLOW_INJECT_FAULT="1:recompute:stop" timeout -k 5 120 "$agent" "$nsA" "$mpiexec" -n 2 \
        --host "$addrA,$addrB" "${net[@]}" -x INFOFLOW_INJECT_FAULT \
        --output-filename "$tmp/ranks" "$bin" "${common[@]}" \
        --set parallel.timeout_s=$timeout_s --out "$tmp/r.json" > "$tmp/out.txt" 2>&1 &
    job=$!
    # Rank 1 stops itself entering recompute (rank 0 goes on into recompute's first collective
    # and waits there); the link goes down, and rank 1 continues into a collective it cannot
    # finish.
    stopped=$(stopped_rank_pid "$nsB") || { cat "$tmp/out.txt"; fail "rank 1 never reached recompute"; }
    ip -n "$nsA" link set "$vethA" down || fail "cannot cut the link"
    t0=$(mono_s)
    if [ "$case_name" = cutlink_hung ]; then
        # Host B's daemon hangs too: rank 1's MPI_Abort, which waits for that daemon, never
        # returns, and only the rank's own bounded abort (2 s) ends it.
        for p in $(ip netns pids "$nsB"); do
            [ "$(ps -o comm= -p "$p")" = orted ] && kill -STOP "$p" && echo "stopped orted $p on $nsB"
        done
    fi
    kill -CONT "$stopped"
    # The ranks must end by their own deadline, within timeout + 10 s.
    ranks_gone=""
    for _ in $(seq 1 $(((timeout_s + 10) * 10))); do
        if [ -z "$(pgrep -x infoflow_sp | while read -r p; do
            ip netns identify "$p" 2>/dev/null | grep -qE "^($nsA|$nsB)$" && echo "$p"; done)" ]; then
            ranks_gone=$(python3 -c "print(round($(mono_s) - $t0, 1))")
            break
        fi
        sleep 0.1
    done
    [ -n "$ranks_gone" ] || { ps -ef | grep -F "$tmp" | grep -v grep; cat "$tmp/out.txt";
                              fail "a rank still runs $timeout_s + 10 s after the link was cut"; }
    if [ "$case_name" = cutlink_hung ]; then
        cat "$tmp/out.txt"
        grep -qF "[rank 0/2] error: rank 1 did not reach recompute/" "$tmp/out.txt" \
            || fail "rank 0 does not name the unreachable rank 1"
        echo "ok: link cut and host B's daemon stopped in recompute: both ranks gone after" \
             "$ranks_gone s (limit $timeout_s + 10 s); the stopped daemon is removed on exit"
        exit 0
    fi
    # Then mpirun and the daemon on host B end once TCP gives up on their connection (about
    # 13 s after their first unanswered packet, see tcp_retries2 above).
    wait_gone 30
    wait "$job"
    rc=$?
    took=$(python3 -c "print(round($(mono_s) - $t0, 1))")
    cat "$tmp/out.txt"
    for f in "$tmp"/ranks/*/rank.*/stderr; do echo "--- $f"; cat "$f"; done
    [ "$rc" -ne 0 ] || fail "the job exited 0 over a cut link"
    grep -qF "[rank 0/2] error: rank 1 did not reach recompute/" "$tmp/out.txt" \
        || fail "rank 0 does not name the unreachable rank 1"
    grep -qF "within $timeout_s s" "$tmp/out.txt" || fail "message lacks the deadline"
    err1=$(echo "$tmp"/ranks/*/rank.1/stderr)
    grep -qF "[rank 1/2] error: rank 0 did not reach recompute/" "$err1" \
        || fail "rank 1 (host B) did not end by its own deadline naming rank 0"
    [ ! -e "$tmp/r.json" ] || fail "--out written by a failed job"
    echo "ok: link cut in recompute: both ranks named the other and were gone after" \
         "$ranks_gone s (limit $timeout_s + 10 s); mpirun ended rc=$rc after $took s; nothing left"
    ;;
*) fail "unknown case $case_name" ;;
esac
