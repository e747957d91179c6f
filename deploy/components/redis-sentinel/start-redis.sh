#!/bin/sh
# The base's redis-server command line ("$@") as a replica of the primary the
# Sentinels name (none on redis-0's first start), announcing this pod's name.
set -eu
me="$(hostname).redis-headless.split-provisioner.svc"
primary="$(sh /etc/redis-acl-template/find-primary.sh)"
printf 'masteruser replica\nmasterauth %s\n' "$(head -n 1 /etc/redis-users/replica)" > /run/redis/replica.conf
shift # redis-server: the config file comes first
set -- redis-server /run/redis/replica.conf "$@" --replica-announce-ip "$me"
if [ "$primary" != "$me" ]; then set -- "$@" --replicaof "$primary" 6379; fi
exec "$@"
