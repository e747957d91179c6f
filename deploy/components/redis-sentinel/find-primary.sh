#!/bin/sh
# Print the host the Sentinels name as primary; redis-0's on a first start.
for i in 0 1 2; do
  p=$(timeout 3 redis-cli -h "redis-$i.redis-headless.split-provisioner.svc" -p 26379 --raw \
    sentinel get-master-addr-by-name provisioner 2>/dev/null | head -n 1)
  if [ -n "$p" ]; then echo "$p"; exit 0; fi
done
echo redis-0.redis-headless.split-provisioner.svc
