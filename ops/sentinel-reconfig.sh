#!/bin/sh
# Sentinel's client-reconfig-script for the Redis behind dispatchq: when a sentinel takes in
# a failover, point the old primary at the new one at once (docs/many-hosts.md#failover-time).
#
#   sentinel client-reconfig-script <service> /path/to/sentinel-reconfig.sh
#
# Sentinel itself turns the old primary into a replica only after its own wait (8 s since it
# last changed role, checked on a 10 s INFO round): until then a new primary with
# `min-replicas-to-write 1` and no other replica refuses every write. Run by every sentinel,
# leader and observers alike: REPLICAOF to the primary a replica already follows is a no-op.
#
# Sentinel calls it with: <service> <role> <state> <from-ip> <from-port> <to-ip> <to-port>
# and its own environment (systemd: Environment= / EnvironmentFile= of the sentinel unit):
#   REDIS_CLI            the redis-cli to run (default: redis-cli on PATH)
#   REDISCLI_AUTH        the password of a user that may run REPLICAOF on the data nodes, or
#   REDIS_PASSWORD_FILE  a file holding it (keep it readable by the sentinel's user only)
#   REDIS_CLI_ARGS       more redis-cli arguments: --user <name> for an ACL user (not dispatchq's:
#                        REPLICAOF is @admin), --tls --cacert <file> for TLS data nodes
#
# An old primary that does not answer (crashed, cut off) is left alone: Sentinel converts it
# when it is back. The script always exits 0, so Sentinel does not retry it.
set -u
from_ip=$4 from_port=$5 to_ip=$6 to_port=$7
if [ -n "${REDIS_PASSWORD_FILE:-}" ]; then
    REDISCLI_AUTH=$(cat "$REDIS_PASSWORD_FILE") || exit 0
    export REDISCLI_AUTH
fi
limit=""
if command -v timeout >/dev/null 2>&1; then
    limit="timeout 5"
fi
# shellcheck disable=SC2086 # REDIS_CLI_ARGS is a list of arguments
$limit "${REDIS_CLI:-redis-cli}" ${REDIS_CLI_ARGS:-} -h "$from_ip" -p "$from_port" \
    REPLICAOF "$to_ip" "$to_port" >/dev/null 2>&1
exit 0
