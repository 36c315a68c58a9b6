#!/usr/bin/env bash
# Slurm end to end, run by CTest (label slurm): starts a one-node cluster
# (launch/slurm/test-cluster.sh), submits launch/slurm/infoflow-cpu.sbatch with 2 tasks
# (srun --mpi=pmix), waits, and checks that its JSON equals `mpirun -np 2`'s: answer text and
# ids, selected positions, first-token top logits, bytes sent/received per rank and phase. Then
# submits it again with rank 1 failing mid-run: the job must end (not hang) with a message
# naming rank 1. Everything the cluster started is stopped by test-cluster.sh, also on failure.
#   slurm_test.sh BIN MPIEXEC
# Exit 77 (skipped) when Slurm or munge is not installed or not running as root. About 40 s.
set -uo pipefail
bin="$1"; mpiexec="$2"
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$root"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_mpi_yield_when_idle=1
export OMP_WAIT_POLICY=passive INFOFLOW_PROGRESS=0
fail() { echo "FAIL: $*"; exit 1; }
args=(--set decode.max_new_tokens=12)

# The reference: the same config on 2 ranks under mpirun.
"$mpiexec" -n 2 --oversubscribe "$bin" --config configs/demo.toml --set model.threads=1 \
    "${args[@]}" --out "$tmp/mpirun.json" > "$tmp/mpirun.txt" 2>&1 \
    || { cat "$tmp/mpirun.txt"; fail "mpirun -np 2 exited non-zero"; }

# Inside the cluster: the good job, then the failing one. sbatch --wait returns the job's exit
# status; `timeout` bounds a hang.
cat > "$tmp/in-cluster.sh" << EOS
set -u
cd "$root"
export CONFIG=configs/demo.toml INFOFLOW_BIN="$bin"
start=\$(date +%s)
OUT="$tmp/slurm.json" timeout 300 sbatch --wait --quiet --ntasks=2 --cpus-per-task=1 \
    --chdir="$root" --output="$tmp/slurm-%j.out" launch/slurm/infoflow-cpu.sbatch ${args[*]}
echo "good job rc \$? in \$(( \$(date +%s) - start )) s" > "$tmp/good.rc"
start=\$(date +%s)
INFOFLOW_INJECT_FAULT="1:scoring" OUT="$tmp/fault.json" timeout 120 sbatch --wait --quiet \
    --ntasks=2 --cpus-per-task=1 --chdir="$root" --output="$tmp/fault-%j.out" \
    launch/slurm/infoflow-cpu.sbatch ${args[*]}
echo "fault job rc \$? in \$(( \$(date +%s) - start )) s" > "$tmp/fault.rc"
EOS
"$root/launch/slurm/test-cluster.sh" bash "$tmp/in-cluster.sh"
rc=$?
[ "$rc" -ne 77 ] || exit 77
[ "$rc" -eq 0 ] || fail "test-cluster.sh exited $rc"
cat "$tmp"/slurm-*.out "$tmp/good.rc" 2>/dev/null
grep -q "good job rc 0 " "$tmp/good.rc" || fail "the sbatch job failed: $(cat "$tmp/good.rc")"
python3 - "$tmp/mpirun.json" "$tmp/slurm.json" << 'PY' || exit 1
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
assert b["ranks"] == 2, b["ranks"]
for key in ["answer", "selected_positions", "first_token_top", "context_tokens", "chunk_order"]:
    assert a[key] == b[key], f"{key} differs: mpirun {a[key]!r} vs srun {b[key]!r}"
pa = {p["name"]: (p["bytes_sent"], p["bytes_recv"]) for p in a["phases"]}
pb = {p["name"]: (p["bytes_sent"], p["bytes_recv"]) for p in b["phases"]}
assert pa == pb, f"bytes differ: {pa} vs {pb}"
assert b["provenance"]["ranks"] == 2
print("ok: srun --mpi=pmix equals mpirun -np 2:", repr(b["answer"]["text"]))
PY
cat "$tmp"/fault-*.out "$tmp/fault.rc" 2>/dev/null
grep -q "fault job rc 0 " "$tmp/fault.rc" && fail "the job with a failing rank succeeded"
grep -q "fault job rc 124 " "$tmp/fault.rc" && fail "the job with a failing rank hung"
grep -q "\[rank 1/2\] error: injected fault on rank 1" "$tmp"/fault-*.out \
    || fail "no message naming rank 1"
[ -f "$tmp/fault.json" ] && fail "the failed job wrote a result"
echo "ok: a failing rank ends the Slurm job: $(cat "$tmp/fault.rc")"
