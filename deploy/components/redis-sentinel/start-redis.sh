#!/bin/sh
# The base's redis-server command line ("$@") as a replica of the primary the
# Sentinels name (none on redis-0's first start), announcing this pod's name.
# A primary without a replica that acknowledged within 4 s refuses writes
# (NOREPLICAS) by the time the Sentinels call it down (5 s silent), so one cut
# off from the others stops taking writes a failover would drop. Full resyncs
# start at once (not after 5 s): a new primary has a replica again sooner.
set -eu
me="$(hostname).redis-headless.split-provisioner.svc"
primary="$(sh /etc/redis-acl-template/find-primary.sh)"
printf 'masteruser replica\nmasterauth %s\n' "$(head -n 1 /etc/redis-users/replica)" > /run/redis/replica.conf
shift # redis-server: the config file comes first
set -- redis-server /run/redis/replica.conf "$@" --replica-announce-ip "$me"
set -- "$@" --min-replicas-to-write 1 --min-replicas-max-lag 4 --repl-diskless-sync-delay 0
if [ "$primary" != "$me" ]; then set -- "$@" --replicaof "$primary" 6379; fi
exec "$@"
