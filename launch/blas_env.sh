# Sourced by the launch and bench scripts: names OpenBLAS's kernel family from the CPU's flags
# when the user has not (OPENBLAS_CORETYPE). OpenBLAS picks its kernels from the CPU model, and
# on a model it does not know (a virtual machine that reports a generic "Intel Xeon Processor"
# does this) it falls back to its SSE3 "Prescott" kernels: prefill ran 3-4x slower that way on
# the development machine (512 tokens, 1 thread: ~90 against 320-390 tokens/s). Running with
# OPENBLAS_VERBOSE=2 prints the family OpenBLAS chose.
if [[ -z ${OPENBLAS_CORETYPE:-} && -r /proc/cpuinfo ]]; then
    _if_flags=" $(grep -m1 '^flags' /proc/cpuinfo | cut -d: -f2-) "
    if [[ $_if_flags == *" avx512_bf16 "* && $_if_flags == *" avx512bw "* ]]; then
        export OPENBLAS_CORETYPE=Cooperlake
    elif [[ $_if_flags == *" avx512f "* && $_if_flags == *" avx512bw "* && $_if_flags == *" avx512vl "* ]]; then
        export OPENBLAS_CORETYPE=SkylakeX
    elif [[ $_if_flags == *" avx2 "* && $_if_flags == *" fma "* ]]; then
        export OPENBLAS_CORETYPE=Haswell
    fi
    unset _if_flags
fi
