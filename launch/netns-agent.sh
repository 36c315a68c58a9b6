#!/bin/sh
# Remote-launch agent for Open MPI that reaches "hosts" made of Linux network namespaces on
# this machine instead of other machines over ssh (docs/multinode.md). Use it as
#   mpirun --mca plm_rsh_agent launch/netns-agent.sh --host ADDR_A,ADDR_B ...
# with INFOFLOW_NETNS_MAP="ADDR_A=NS_A ADDR_B=NS_B" in the environment (addresses or names as
# given to --host, each mapped to the network namespace that holds it). Open MPI calls
#   netns-agent.sh HOST WORD...
# exactly as it would call ssh: the words are one shell command line (they carry quotes), so
# they go through /bin/sh -c, as the remote login shell of ssh would run them. The command
# runs inside the namespace in a UTS namespace of its own whose host name is the namespace's
# name: two Open MPI daemons with one host name would share their session directory and
# shared-memory segment names and fail intermittently.
#
# Called with a namespace name as HOST (not in the map), it runs the words in that namespace
# the same way: `netns-agent.sh NS_A mpirun ...` starts mpirun itself "on" host A.
set -eu
[ "$#" -ge 2 ] || { echo "usage: netns-agent.sh HOST COMMAND-WORD..." >&2; exit 2; }
host=$1
shift
ns=""
for pair in ${INFOFLOW_NETNS_MAP:-}; do
    if [ "${pair%%=*}" = "$host" ]; then ns=${pair#*=}; fi
done
if [ -z "$ns" ]; then
    if ip netns list | cut -d' ' -f1 | grep -qxF -- "$host"; then
        ns=$host
    else
        echo "netns-agent.sh: host '$host' is not in INFOFLOW_NETNS_MAP ('${INFOFLOW_NETNS_MAP:-}')" \
             "and no network namespace has that name" >&2
        exit 255  # what ssh returns when it cannot reach the host
    fi
fi
exec ip netns exec "$ns" unshare --uts /bin/sh -c 'hostname "$0" && exec /bin/sh -c "$1"' \
    "$ns" "$*"
