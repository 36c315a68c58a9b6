# Monotonic clocks for the test scripts' time limits, sourced by tests/*/*.sh.
# `date` is the wall clock: a fresh machine's time sync can step it by seconds in the middle of
# a test (CI once saw a job that ran 10.8 s measured as 18.6 s). /proc/uptime never steps.
mono_s() { local u _r; read -r u _r < /proc/uptime; echo "$u"; }            # seconds, 0.01 s
mono_i() { local u _r; read -r u _r < /proc/uptime; echo "${u%.*}"; }       # whole seconds
mono_ns() {                                                                  # nanoseconds
    local u _r; read -r u _r < /proc/uptime
    echo $(( ${u%.*} * 1000000000 + 10#${u#*.} * 10000000 ))
}
