#!/usr/bin/env bash
# One engine and its traffic-manager in one container: the TM attaches the engine's KV
# memory by POSIX shm name, so both need the same host, the same /dev/shm, the same id.
#
# usage: dualpath-engine-entry prefill-engine|decode-engine [engine flags...]
# env:   DUALPATH_ENGINE      engine id (default <pe|de>-$HOSTNAME-<4 random hex digits>: in
#                             compose the hostname is the container id, so every scaled
#                             replica gets its own; the random part is new at every start,
#                             so a restarted container is a new engine to its peers, as its
#                             KV memory and data-plane port are new too)
#        ENGINE_METRICS_PORT  engine /metrics port (default 9100)
#        TM_METRICS_PORT      traffic-manager /metrics port (default 9101)
#        TM_NICE              traffic-manager CPU niceness (default 10: the pair shares the
#                             container's cores, and the engine's forward has them first)
#        TM_FLAGS             extra traffic-manager flags, e.g. "--buffer-mb 1024"
# Other DUALPATH_* variables reach both processes; each takes only its own fields.
# Either process exiting stops the other and the container, so the restart policy
# restarts the pair; SIGTERM is passed to both (each announces `leaving` and drains).
set -euo pipefail

role="${1:?usage: dualpath-engine-entry prefill-engine|decode-engine [flags...]}"
shift
case "$role" in
    prefill-engine) prefix=pe ;;
    decode-engine) prefix=de ;;
    *) echo "dualpath-engine-entry: not an engine service: $role" >&2; exit 2 ;;
esac

export DUALPATH_HOST="${DUALPATH_HOST:-$(python -c 'import socket; print(socket.gethostbyname(socket.gethostname()))')}"
start="$(od -An -N2 -tx1 /dev/urandom | tr -d ' \n')"
id="${DUALPATH_ENGINE:-$prefix-${HOSTNAME:-$(hostname)}-$start}"
echo "dualpath-engine-entry: $role + traffic-manager, engine id $id, host $DUALPATH_HOST" >&2

# shellcheck disable=SC2086  # TM_FLAGS is a list of flags
dualpath service traffic-manager --engine "$id" --metrics-port "${TM_METRICS_PORT:-9101}" --nice "${TM_NICE:-10}" ${TM_FLAGS:-} &
tm=$!
dualpath service "$role" --engine "$id" --metrics-port "${ENGINE_METRICS_PORT:-9100}" "$@" &
engine=$!

signalled=0
on_signal() {
    signalled=1
    kill -TERM "$engine" "$tm" 2>/dev/null || true
}
trap on_signal TERM INT

set +e
wait -n "$engine" "$tm"  # the first to exit (or a signal) ends the pair
rc=$?
kill -TERM "$engine" "$tm" 2>/dev/null
wait "$engine" "$tm"
[ "$signalled" = 1 ] && exit 0  # stopped on purpose (docker stop): a clean exit
exit "$rc"
