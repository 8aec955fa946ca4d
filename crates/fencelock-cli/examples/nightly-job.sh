#!/bin/sh
# A job that must not run twice at once, from cron on every host:
#
#   0 2 * * *  FENCELOCK_REDIS=redis://redis.internal:6379 /usr/local/bin/nightly-job.sh make-report --all
#
# The first host to take the lock runs the job (the arguments: any command) under it; the
# others find the lock held and skip the job, with status 0, since it is being done.
# fencelock renews the lease while the job runs, and stops the job if the lease is lost.
# Exit status: the job's own, 0 when skipped; fencelock's documented codes otherwise
# (69 Redis unreachable, 76 lease lost: `fencelock run --help`).
set -u
fencelock run --wait 0s --ttl 60s jobs:nightly-report -- "$@"
status=$?
if [ "$status" -eq 75 ]; then
    # 75: held by another host, which is doing the job.
    echo "nightly job: another host is running it; skipped" >&2
    exit 0
fi
exit "$status"
