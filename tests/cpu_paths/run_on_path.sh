#!/usr/bin/env bash
# Runs a test command on one CPU kernel path (docs/design.md §6 "Numerics per CPU path"), as the
# CTest variants of the shell and Python tests do:
#   tests/cpu_paths/run_on_path.sh PATH INFOFLOW_SP COMMAND ARGS...
# PATH is avx2, avx512 or amx. The command and every infoflow_sp it starts see
# INFOFLOW_CPU_ISA=PATH (amx on the tile emulator, INFOFLOW_AMX_EMULATE=1, where the CPU has no
# AMX) and INFOFLOW_EXPECT_ISA=PATH, under which a run that used another path fails. Exits 77
# (skipped) where `INFOFLOW_SP --version` does not list PATH among the paths this CPU can run.
set -euo pipefail
path="$1"
bin="$2"
shift 2
case "$path" in
    avx2 | avx512 | amx) ;;
    *) echo "run_on_path.sh: unknown path '$path' (avx2, avx512 or amx)" >&2; exit 2 ;;
esac
runnable() {  # the paths `infoflow_sp --version` lists as runnable, under the current environment
    INFOFLOW_CPU_ISA= "$bin" --version | sed -n 's/^cpu paths: \([^(]*\).*/\1/p'
}
unset INFOFLOW_AMX_EMULATE
paths=$(runnable)
if [[ $path == amx && " $paths " != *" amx "* ]]; then
    export INFOFLOW_AMX_EMULATE=1  # no usable AMX here: the tile emulator
    paths=$(runnable)
fi
if [[ " $paths " != *" $path "* ]]; then
    echo "skipped: the $path path cannot run on this CPU (runnable here: $paths)"
    exit 77
fi
export INFOFLOW_CPU_ISA="$path" INFOFLOW_EXPECT_ISA="$path"
exec "$@"
