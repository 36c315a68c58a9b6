#!/usr/bin/env bash
# A one-node Slurm cluster on this machine for tests and for trying the sbatch scripts:
# munged, slurmctld and slurmd on localhost, every file (munge key, slurm.conf, state, logs) in a
# fresh temp directory, ports picked free. Runs COMMAND with SLURM_CONF set, then stops every
# daemon it started and removes the directory, also when COMMAND or the start-up fails.
#   launch/slurm/test-cluster.sh                     # start, show sinfo and `srun -n 2 hostname`, stop
#   launch/slurm/test-cluster.sh sbatch --wait launch/slurm/infoflow-cpu.sbatch
#   launch/slurm/test-cluster.sh bash                # an interactive shell inside the cluster
# Needs root (slurmd starts job steps as the submitting user) and Debian's slurm-wlm + munge
# (launch/setup.sh installs them). Exit status: COMMAND's; 77 when Slurm or munge is missing.
# Start-up takes about 2 s, shut-down about 1 s.
set -uo pipefail

for tool in munged mungekey slurmctld slurmd sinfo srun sbatch; do
    if ! command -v "$tool" > /dev/null 2>&1 && [ ! -x "/usr/sbin/$tool" ]; then
        echo "[test-cluster] $tool not found: install slurm-wlm and munge (launch/setup.sh)" >&2
        exit 77
    fi
done
export PATH="$PATH:/usr/sbin"
if [ "$(id -u)" != "0" ]; then
    echo "[test-cluster] must run as root (slurmd launches job steps as the submitting user)" >&2
    exit 77
fi

dir="$(mktemp -d /tmp/infoflow-slurm.XXXXXX)"
chmod 700 "$dir"
pids=()
stop() {
    # Daemons in reverse start order; each by the pid it was started with.
    local i
    for ((i = ${#pids[@]} - 1; i >= 0; i--)); do kill "${pids[$i]}" 2> /dev/null; done
    for ((i = ${#pids[@]} - 1; i >= 0; i--)); do
        for _ in $(seq 50); do kill -0 "${pids[$i]}" 2> /dev/null || break; sleep 0.1; done
        kill -9 "${pids[$i]}" 2> /dev/null
        wait "${pids[$i]}" 2> /dev/null
    done
    if [ "${INFOFLOW_SLURM_KEEP:-0}" = "1" ]; then
        echo "[test-cluster] kept $dir" >&2
    else
        rm -rf "$dir"
    fi
}
trap stop EXIT
trap 'exit 130' INT TERM

die() {
    echo "[test-cluster] error: $*" >&2
    for f in "$dir"/*.log; do [ -f "$f" ] && { echo "--- $f" >&2; tail -n 20 "$f" >&2; }; done
    exit 1
}

# A free TCP port on localhost (bind to port 0, read what the kernel gave).
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# ---- munge ---------------------------------------------------------------------------------
mungekey -c -k "$dir/munge.key" > /dev/null 2>&1 || die "mungekey failed"
chmod 600 "$dir/munge.key"
munged -F --force --key-file="$dir/munge.key" --socket="$dir/munge.socket" \
    --pid-file="$dir/munged.pid" --log-file="$dir/munged.log" --seed-file="$dir/munge.seed" > "$dir/munged.out" 2>&1 &
pids+=($!)
for _ in $(seq 50); do [ -S "$dir/munge.socket" ] && break; sleep 0.1; done
[ -S "$dir/munge.socket" ] || die "munged did not start"

# ---- slurm.conf ----------------------------------------------------------------------------
node="$(hostname -s)"
cpus="$(nproc)"
ctld_port="$(free_port)"
slurmd_port="$(free_port)"
mkdir -p "$dir/state" "$dir/spool"
cat > "$dir/slurm.conf" << EOF
ClusterName=infoflow-test
SlurmctldHost=${node}(127.0.0.1)
SlurmctldPort=${ctld_port}
SlurmdPort=${slurmd_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=${dir}/munge.socket
StateSaveLocation=${dir}/state
SlurmdSpoolDir=${dir}/spool
SlurmctldPidFile=${dir}/slurmctld.pid
SlurmdPidFile=${dir}/slurmd.pid
SlurmctldLogFile=${dir}/slurmctld.log
SlurmdLogFile=${dir}/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=pmix
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
ReturnToService=2
SlurmdTimeout=30
InactiveLimit=0
KillWait=5
MinJobAge=30
NodeName=${node} NodeAddr=127.0.0.1 CPUs=${cpus} State=UNKNOWN
PartitionName=debug Nodes=${node} Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
EOF
export SLURM_CONF="$dir/slurm.conf"

slurmctld -D -i -f "$SLURM_CONF" > "$dir/slurmctld.out" 2>&1 &
pids+=($!)
slurmd -D -f "$SLURM_CONF" -N "$node" > "$dir/slurmd.out" 2>&1 &
pids+=($!)
ready=0
for _ in $(seq 100); do
    if sinfo -h -o '%T' 2> /dev/null | grep -qE '^(idle|mixed|allocated)'; then ready=1; break; fi
    sleep 0.2
done
[ "$ready" = 1 ] || die "the node did not come up (sinfo: $(sinfo -h 2>&1 | head -n 1))"
echo "[test-cluster] up: node $node, $cpus CPUs, SLURM_CONF=$SLURM_CONF" >&2

if [ "$#" -eq 0 ]; then
    sinfo
    srun -n 2 hostname
    exit $?
fi
"$@"
