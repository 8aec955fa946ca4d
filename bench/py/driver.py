"""Worker process of fencelock-bench for the Python peers.

Speaks the protocol of the Rust worker (bench/src/worker.rs), one line each on stdout:
``ready`` once connected; after the harness writes ``go START_NS`` on stdin (a
CLOCK_MONOTONIC time shortly ahead, the same for every worker) the contenders run from
START_NS for --duration-ms (or, for ``latency``, for --cycles cycles); then the results
(``sample NS``, ``count N``, ``stat NAME N``, ``error MSG``) and ``done``. It exits as
soon as its stdin closes (the harness died), so it never outlives the harness.

Locks (--lock): ``redis-py`` is redis-py's ``Lock`` (SET NX PX, then polling with
``sleep`` seconds between attempts: 0.1 by default, --sleep to tune);
``python-redis-lock`` is ``redis_lock.Lock`` (SET NX EX, then BLPOP on a signal list that
the release script pushes to). Contenders are threads (both libraries are synchronous),
each with its own redis-py client.
"""

import argparse
import math
import os
import sys
import threading
import time

import redis
import redis_lock

CLOCK = time.CLOCK_MONOTONIC


def mono_ns():
    return time.clock_gettime_ns(CLOCK)


def sleep_until(ns):
    while True:
        left = ns - mono_ns()
        if left <= 0:
            return
        time.sleep(left / 1e9)


class Locker:
    """Takes and gives back the lock under test, for one contender."""

    def __init__(self, args, client):
        self.args = args
        self.client = client
        self.ttl_s = max(1, args.ttl_ms // 1000)
        self.lock = None

    def acquire(self, deadline_ns, blocking=True):
        """True once held; False when the deadline came first (or not blocking)."""
        name = self.args.name + ":lock"
        left = (deadline_ns - mono_ns()) / 1e9
        if blocking and left <= 0:
            return False
        if self.args.lock == "redis-py":
            lock = self.client.lock(name, timeout=self.args.ttl_ms / 1000, sleep=self.args.sleep)
            if blocking:
                got = lock.acquire(blocking=True, blocking_timeout=left)
            else:
                got = lock.acquire(blocking=False)
        else:
            lock = redis_lock.Lock(self.client, name, expire=self.ttl_s)
            if blocking:
                # Whole seconds, at most the lease (the library's rules).
                timeout = min(self.ttl_s, max(1, math.ceil(left)))
                got = lock.acquire(blocking=True, timeout=timeout)
            else:
                got = lock.acquire(blocking=False)
        if got:
            self.lock = lock
        return bool(got)

    def release(self):
        lock, self.lock = self.lock, None
        lock.release()


def new_client(args):
    return redis.Redis.from_url(args.url)


class Result:
    def __init__(self):
        self.samples = []
        self.acquisitions = 0
        self.same_process = 0
        self.late = 0
        self.max_wait = 0
        self.errors = []


STAMP_LEN = 64


def read_stamp(fd):
    """The last stamp in the run's stamp file (the Rust worker's StampFile: one record at
    its start, padded with spaces to STAMP_LEN bytes), or None before the first."""
    text = os.pread(fd, STAMP_LEN, 0).decode().strip()
    return text or None


def write_stamp(fd, stamp):
    os.pwrite(fd, stamp.ljust(STAMP_LEN).encode(), 0)


def handoff_task(args, task, first_ns, deadline_ns, out):
    """Strict handoff, as in the Rust worker: acquire, read the previous holder's stamp
    (from the run's stamp file, so no Redis round trip), record release-to-acquire if it
    was another process and we were already waiting, tell it its lock was taken, hold,
    stamp, release, wait until someone took it."""
    r = Result()
    out[task] = r
    try:
        client = new_client(args)
        blpop = new_client(args)
        locker = Locker(args, client)
        stamps = os.open(args.stamp_file, os.O_RDWR)
        pid = os.getpid()
        me = f"{pid}:{task}"
        my_inbox = f"{args.name}:taken:{me}"
        hold = args.hold_us / 1e6
        sleep_until(first_ns)
        while mono_ns() < deadline_ns:
            started = mono_ns()
            if not locker.acquire(deadline_ns):
                break
            now = mono_ns()
            r.acquisitions += 1
            prev = read_stamp(stamps)
            pipe = client.pipeline(transaction=False)
            pipe.delete(my_inbox)
            if prev is not None:
                ppid, pns, ptask = prev.split(" ")
                ppid, pns = int(ppid), int(pns)
                prev_id = f"{ppid}:{ptask}"
                if ppid == pid:
                    r.same_process += 1
                elif started <= pns:
                    r.samples.append(max(0, now - pns))
                else:
                    r.late += 1
                if prev_id != me:
                    pipe.lpush(f"{args.name}:taken:{prev_id}", 1)
            pipe.execute()
            time.sleep(hold)
            write_stamp(stamps, f"{pid} {mono_ns()} {task}")
            locker.release()
            while True:
                if mono_ns() >= deadline_ns:
                    return
                left = (deadline_ns - mono_ns()) / 1e9
                if blpop.blpop([my_inbox], timeout=min(0.5, max(0.01, left))) is not None:
                    break
    except Exception as e:  # reported, never raised: the harness shows it in the table
        r.errors.append(f"{type(e).__name__}: {e}")


def hot_key_task(args, task, start_ns, deadline_ns, out):
    """Acquire (waiting until the deadline), hold, release, as fast as possible; counts."""
    r = Result()
    out[task] = r
    try:
        locker = Locker(args, new_client(args))
        hold = args.hold_us / 1e6
        sleep_until(start_ns)
        while mono_ns() < deadline_ns:
            asked = mono_ns()
            got = locker.acquire(deadline_ns)
            r.max_wait = max(r.max_wait, mono_ns() - asked)
            if not got:
                break
            if mono_ns() >= deadline_ns:
                locker.release()  # late: past the window, not counted
                break
            r.acquisitions += 1
            if hold > 0:
                time.sleep(hold)
            locker.release()
    except Exception as e:
        r.errors.append(f"{type(e).__name__}: {e}")


def latency(args, start_ns, out):
    """Uncontended acquire + release cycles, then as many PINGs, in blocks of 100."""
    r = Result()
    out[0] = r
    try:
        client = new_client(args)
        locker = Locker(args, client)
        far = mono_ns() + 3600 * 10**9
        pings = []

        def cycle():
            t = mono_ns()
            if not locker.acquire(far, blocking=False):
                raise RuntimeError("uncontended acquire failed")
            locker.release()
            return mono_ns() - t

        def ping():
            t = mono_ns()
            client.ping()
            return mono_ns() - t

        for _ in range(max(100, args.cycles // 10)):  # warm-up
            cycle()
            ping()
        sleep_until(start_ns)
        while len(r.samples) < args.cycles:
            k = min(100, args.cycles - len(r.samples))
            r.samples.extend(cycle() for _ in range(k))
            pings.extend(ping() for _ in range(k))
        r.pings = pings
    except Exception as e:
        r.errors.append(f"{type(e).__name__}: {e}")


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--url", required=True)
    p.add_argument("--scenario", choices=["handoff", "hot-key", "latency"], required=True)
    p.add_argument("--lock", choices=["redis-py", "python-redis-lock"], required=True)
    p.add_argument("--sleep", type=float, default=0.1, help="redis-py Lock(sleep=...)")
    p.add_argument("--name", required=True)
    p.add_argument("--tasks", type=int, default=1)
    p.add_argument("--hold-us", type=int, default=0)
    p.add_argument("--duration-ms", type=int, default=1000)
    p.add_argument("--cycles", type=int, default=1000)
    p.add_argument("--proc-index", type=int, default=0)
    p.add_argument("--procs", type=int, default=1)
    p.add_argument("--contenders", type=int, default=1)
    p.add_argument("--spread-ms", type=int, default=100)
    p.add_argument("--ttl-ms", type=int, default=10000)
    p.add_argument("--stamp-file", help="handoff: the run's stamp file (made by the harness)")
    args = p.parse_args()

    new_client(args).ping()
    print("ready", flush=True)
    line = sys.stdin.readline()
    if not line.startswith("go "):
        os._exit(3)
    start_ns = int(line.split()[1])

    def watch_stdin():
        sys.stdin.read()
        os._exit(3)

    threading.Thread(target=watch_stdin, daemon=True).start()

    deadline_ns = start_ns + args.duration_ms * 10**6
    out = {}
    threads = []
    if args.scenario == "latency":
        threads.append(threading.Thread(target=latency, args=(args, start_ns, out)))
    for task in range(args.tasks if args.scenario != "latency" else 0):
        if args.scenario == "handoff":
            g = task * args.procs + args.proc_index
            first = start_ns + g * args.spread_ms * 10**6 // max(1, args.contenders)
            threads.append(
                threading.Thread(target=handoff_task, args=(args, task, first, deadline_ns, out))
            )
        else:
            threads.append(
                threading.Thread(target=hot_key_task, args=(args, task, start_ns, deadline_ns, out))
            )
    for t in threads:
        t.start()
    for t in threads:
        t.join()

    lines = []
    total = Result()
    for task in sorted(out):
        r = out[task]
        if args.scenario == "hot-key":
            lines.append(f"count {r.acquisitions}")
        total.samples.extend(r.samples)
        total.acquisitions += r.acquisitions
        total.same_process += r.same_process
        total.late += r.late
        total.max_wait = max(total.max_wait, r.max_wait)
        total.errors.extend(r.errors)
        lines.extend(f"ping {s}" for s in getattr(r, "pings", []))
    lines.extend(f"sample {s}" for s in total.samples)
    lines.append(f"stat acquisitions {total.acquisitions}")
    lines.append(f"stat same_process {total.same_process}")
    lines.append(f"stat late {total.late}")
    lines.append(f"stat max_wait {total.max_wait}")
    lines.extend("error " + e.replace("\n", " ") for e in total.errors)
    lines.append("done")
    sys.stdout.write("\n".join(lines) + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
