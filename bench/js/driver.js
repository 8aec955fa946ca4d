// Worker process of fencelock-bench for the Node peers, node-redlock (npm `redlock`, v5,
// on `ioredis`) and redis-semaphore's `Semaphore` (npm `redis-semaphore`, on `ioredis`).
//
// Speaks the protocol of the Rust worker (bench/src/worker.rs) and of the Python driver
// (bench/py/driver.py), one line each on stdout: `ready` once connected; after the
// harness writes `go START_NS` on stdin (a CLOCK_MONOTONIC time shortly ahead, the same
// for every worker) the contenders run from START_NS for --duration-ms (or, for
// `latency`, for --cycles cycles); then the results (`sample NS`, `ping NS`, `count N`,
// `stat NAME N`, `error MSG`) and `done`. It exits as soon as its stdin closes (the
// harness died), so it never outlives the harness.
//
// Lock (--lock node-redlock): `redlock.acquire([resource], ttl)`, which runs its acquire
// script and, on a refusal, tries again after `retryDelay ± retryJitter` ms, at most
// `retryCount` more times, then throws an ExecutionError; waiting is `acquire` in a loop
// until the deadline (the library has no other way to wait). --retry-count,
// --retry-delay and --retry-jitter are passed to the library as they are. Contenders
// are concurrent async tasks of this one process, each with its own ioredis client and
// its own Redlock instance (as the Python driver's threads each have a redis-py client).
// With several --url, the Redlock instance spans all of them (a majority must grant)
// and the latency run's PINGs go to every node at once; the contended scenarios use
// one node.
//
// Semaphore (--lock redis-semaphore --permits N --retry-interval MS): one
// `new Semaphore(client, key, N, { lockTimeout, retryInterval })` per contender, reused
// for each of its acquisitions; `tryAcquire`, which runs its acquire script and, on a
// refusal, tries again every `retryInterval` ms until `acquireTimeout` (left at its
// default) and then returns false; waiting is `tryAcquire` in a loop until the
// deadline, which aborts it. The semaphore handoff (--scenario semaphore-handoff) is the
// handoff with its stamps queued in a list, as in the Rust worker.
//
// `node driver.js --versions` prints the versions of Node, redlock, ioredis and
// redis-semaphore (the harness's check that they load), and exits.

"use strict";

const fs = require("node:fs");
const path = require("node:path");
const { parseArgs } = require("node:util");
const { setTimeout: sleep } = require("node:timers/promises");

let Redis, Redlock, ExecutionError, ResourceLockedError, Semaphore;
try {
  Redis = require("ioredis");
  ({ default: Redlock, ExecutionError, ResourceLockedError } = require("redlock"));
  ({ Semaphore } = require("redis-semaphore"));
} catch (e) {
  process.stderr.write(
    `cannot load ioredis, redlock and redis-semaphore: ${String(e.message).split("\n")[0]}\n`,
  );
  process.exit(2);
}

/**
 * `Node v20.19.2, redlock v5.0.0-beta.2, ioredis 5.9.3, redis-semaphore 5.8.0`, from the
 * installed packages.
 */
function versions() {
  const version = (name) =>
    JSON.parse(fs.readFileSync(path.join(__dirname, "node_modules", name, "package.json")))
      .version;
  return (
    `Node ${process.version}, redlock ${version("redlock")}, ioredis ${version("ioredis")}, ` +
    `redis-semaphore ${version("redis-semaphore")}`
  );
}

/** CLOCK_MONOTONIC in ns, as a BigInt (libuv's hrtime reads CLOCK_MONOTONIC). */
function monoNs() {
  return process.hrtime.bigint();
}

/** Resolves at CLOCK_MONOTONIC time `ns` (a BigInt), or at once if it has passed. */
async function sleepUntil(ns) {
  for (;;) {
    const left = ns - monoNs();
    if (left <= 0n) {
      return;
    }
    await sleep(Math.max(1, Math.ceil(Number(left) / 1e6)));
  }
}

function parse() {
  const { values } = parseArgs({
    options: {
      url: { type: "string", multiple: true },
      scenario: { type: "string" },
      lock: { type: "string" },
      "retry-count": { type: "string", default: "10" },
      "retry-delay": { type: "string", default: "200" },
      "retry-jitter": { type: "string", default: "100" },
      permits: { type: "string", default: "1" },
      "retry-interval": { type: "string", default: "10" },
      name: { type: "string" },
      tasks: { type: "string", default: "1" },
      "hold-us": { type: "string", default: "0" },
      "duration-ms": { type: "string", default: "1000" },
      cycles: { type: "string", default: "1000" },
      "proc-index": { type: "string", default: "0" },
      procs: { type: "string", default: "1" },
      contenders: { type: "string", default: "1" },
      "spread-ms": { type: "string", default: "100" },
      "ttl-ms": { type: "string", default: "10000" },
      "stamp-file": { type: "string" },
    },
  });
  const int = (k) => {
    const n = Number(values[k]);
    if (!Number.isFinite(n)) {
      throw new Error(`--${k}: not a number: ${values[k]}`);
    }
    return n;
  };
  if (!values.url || values.url.length === 0 || !values.name) {
    throw new Error("--url and --name are required");
  }
  const scenarios = ["handoff", "hot-key", "latency", "semaphore-handoff"];
  if (!scenarios.includes(values.scenario)) {
    throw new Error(`--scenario: ${scenarios.join(", ")}, not ${values.scenario}`);
  }
  if (!["node-redlock", "redis-semaphore"].includes(values.lock)) {
    throw new Error(`--lock: node-redlock or redis-semaphore, not ${values.lock}`);
  }
  if (values.lock === "redis-semaphore" && values.scenario === "latency") {
    throw new Error("--lock redis-semaphore: handoff, hot-key or semaphore-handoff only");
  }
  return {
    urls: values.url,
    scenario: values.scenario,
    lock: values.lock,
    retry: {
      retryCount: int("retry-count"),
      retryDelay: int("retry-delay"),
      retryJitter: int("retry-jitter"),
    },
    permits: int("permits"),
    retryInterval: int("retry-interval"),
    name: values.name,
    tasks: int("tasks"),
    holdUs: int("hold-us"),
    durationMs: int("duration-ms"),
    cycles: int("cycles"),
    procIndex: int("proc-index"),
    procs: int("procs"),
    contenders: int("contenders"),
    spreadMs: int("spread-ms"),
    ttlMs: int("ttl-ms"),
    stampFile: values["stamp-file"],
  };
}

/** An ioredis client of `url`, connected. */
async function connect(url) {
  const client = new Redis(url, { lazyConnect: true });
  await client.connect();
  return client;
}

/** Takes and gives back the lock under test, for one contender. */
class Locker {
  constructor(args, clients) {
    this.args = args;
    this.resource = `${args.name}:lock`;
    this.redlock = new Redlock(clients, args.retry);
    this.lock = null;
    // Redlock turns every failure of a node into a vote against and only says why on its
    // "error" event: keep what is not the lock being held, so it ends the contender.
    this.failure = null;
    this.redlock.on("error", (e) => {
      if (!(e instanceof ResourceLockedError) && this.failure === null) {
        this.failure = e;
      }
    });
  }

  /**
   * True once held; false when the deadline (a BigInt, ns) came first. Not blocking:
   * one try, no retry.
   */
  async acquire(deadlineNs, blocking = true) {
    if (!blocking) {
      return this.tryOnce({ retryCount: 0 });
    }
    while (monoNs() < deadlineNs) {
      if (await this.tryOnce(undefined)) {
        return true;
      }
    }
    return false;
  }

  async tryOnce(settings) {
    try {
      this.lock = await this.redlock.acquire([this.resource], this.args.ttlMs, settings);
      return true;
    } catch (e) {
      if (!(e instanceof ExecutionError)) {
        throw e;
      }
      if (this.failure !== null) {
        throw this.failure;
      }
      return false;
    }
  }

  async release() {
    const lock = this.lock;
    this.lock = null;
    await lock.release();
  }
}

/**
 * Takes and gives back a permit of redis-semaphore's `Semaphore`, for one contender: the
 * interface of `Locker`.
 */
class SemaphoreLocker {
  constructor(args, client) {
    // Its defaults but `retryInterval` (and `lockTimeout`, the bench's lease, which is
    // its default too); one instance, so one identifier, for every acquisition.
    this.semaphore = new Semaphore(client, `${args.name}:sem`, args.permits, {
      lockTimeout: args.ttlMs,
      retryInterval: args.retryInterval,
    });
    this.deadlineNs = null;
    this.stop = null;
  }

  /**
   * True once held; false when the deadline (a BigInt, ns) came first: it aborts the
   * library's waiting (the signal is checked before each try and ends the pause between
   * tries). Not blocking is not used.
   */
  async acquire(deadlineNs) {
    if (this.deadlineNs !== deadlineNs) {
      this.deadlineNs = deadlineNs;
      this.stop = new AbortController();
      const ms = Math.max(0, Number(deadlineNs - monoNs()) / 1e6);
      setTimeout(() => this.stop.abort(), ms).unref();
    }
    const signal = this.stop.signal;
    while (monoNs() < deadlineNs && !signal.aborted) {
      try {
        // False after `acquireTimeout` of refusals: wait on.
        if (await this.semaphore.tryAcquire(signal)) {
          return true;
        }
      } catch (e) {
        if (signal.aborted) {
          return false;
        }
        throw e;
      }
    }
    return false;
  }

  async release() {
    await this.semaphore.release();
  }
}

class Result {
  constructor() {
    this.samples = [];
    this.pings = [];
    this.acquisitions = 0;
    this.sameProcess = 0;
    this.late = 0;
    this.maxWait = 0n;
    this.errors = [];
  }
}

function describe(e) {
  return `${(e && e.name) || "Error"}: ${(e && e.message) || e}`;
}

/** A stamp record's length in the run's stamp file (the Rust worker's StampFile). */
const STAMP_LEN = 64;

/** The last stamp in the stamp file open as `fd`, or null before the first. */
function readStamp(fd) {
  const buf = Buffer.alloc(STAMP_LEN);
  const n = fs.readSync(fd, buf, 0, STAMP_LEN, 0);
  const text = buf.toString("utf8", 0, n).trim();
  return text === "" ? null : text;
}

/** Overwrites the stamp file's record, padded with spaces. */
function writeStamp(fd, stamp) {
  const buf = Buffer.from(stamp.padEnd(STAMP_LEN));
  fs.writeSync(fd, buf, 0, buf.length, 0);
}

/**
 * Strict handoff, as in the Rust worker: acquire, read the previous holder's stamp
 * (from the run's stamp file, so no Redis round trip), record release-to-acquire if it
 * was another process and we were already waiting, tell it its lock was taken, hold,
 * stamp, release, wait until someone took it. The semaphore handoff queues the stamps
 * in Redis instead, as the Rust worker does: RPUSH before the release, LPOP of the
 * oldest once held (releases and acquisitions paired in order).
 */
async function handoffTask(args, c, task, firstNs, deadlineNs, r) {
  try {
    const { client, blpop, locker } = c;
    const pid = process.pid;
    const me = `${pid}:${task}`;
    const queued = args.scenario === "semaphore-handoff";
    const stampKey = `${args.name}:stamps`;
    const stamps = queued ? null : fs.openSync(args.stampFile, "r+");
    const myInbox = `${args.name}:taken:${me}`;
    const holdMs = args.holdUs / 1000;
    await sleepUntil(firstNs);
    while (monoNs() < deadlineNs) {
      const started = monoNs();
      if (!(await locker.acquire(deadlineNs))) {
        break;
      }
      const now = monoNs();
      r.acquisitions += 1;
      const prev = queued ? await client.lpop(stampKey) : readStamp(stamps);
      const told = client.pipeline().del(myInbox);
      if (prev !== null) {
        const [ppid, pns, ptask] = prev.split(" ");
        const prevNs = BigInt(pns);
        const prevId = `${ppid}:${ptask}`;
        if (Number(ppid) === pid) {
          r.sameProcess += 1;
        } else if (started <= prevNs) {
          r.samples.push(now > prevNs ? now - prevNs : 0n);
        } else {
          r.late += 1;
        }
        if (prevId !== me) {
          told.lpush(`${args.name}:taken:${prevId}`, 1);
        }
      }
      // exec() resolves with [error, reply] pairs: an error is thrown, as a command's is.
      const failed = (await told.exec()).find(([e]) => e);
      if (failed) {
        throw failed[0];
      }
      if (holdMs > 0) {
        await sleep(holdMs);
      }
      const stamp = `${pid} ${monoNs()} ${task}`;
      if (queued) {
        await client.rpush(stampKey, stamp);
      } else {
        writeStamp(stamps, stamp);
      }
      await locker.release();
      for (;;) {
        if (monoNs() >= deadlineNs) {
          return;
        }
        const left = Number(deadlineNs - monoNs()) / 1e9;
        const timeout = Math.min(0.5, Math.max(0.01, left));
        if ((await blpop.blpop(myInbox, timeout)) !== null) {
          break;
        }
      }
    }
  } catch (e) {
    // Reported, never thrown: the harness shows it in the table.
    r.errors.push(describe(e));
  }
}

/** Acquire (waiting until the deadline), hold, release, as fast as possible; counts. */
async function hotKeyTask(args, c, startNs, deadlineNs, r) {
  try {
    const { locker } = c;
    const holdMs = args.holdUs / 1000;
    await sleepUntil(startNs);
    while (monoNs() < deadlineNs) {
      const asked = monoNs();
      const got = await locker.acquire(deadlineNs);
      const waited = monoNs() - asked;
      if (waited > r.maxWait) {
        r.maxWait = waited;
      }
      if (!got) {
        break;
      }
      if (monoNs() >= deadlineNs) {
        await locker.release(); // late: past the window, not counted
        break;
      }
      r.acquisitions += 1;
      if (holdMs > 0) {
        await sleep(holdMs);
      }
      await locker.release();
    }
  } catch (e) {
    r.errors.push(describe(e));
  }
}

/** Uncontended acquire + release cycles, then as many PINGs, in blocks of 100. */
async function latency(args, c, startNs, r) {
  try {
    const { clients, locker } = c;
    const far = monoNs() + 3600n * 1000000000n;
    const cycle = async () => {
      const t = monoNs();
      if (!(await locker.acquire(far, false))) {
        throw new Error("uncontended acquire failed");
      }
      await locker.release();
      return monoNs() - t;
    };
    // One PING to every node at once, until all answered (one node: one PING).
    const ping = async () => {
      const t = monoNs();
      await Promise.all(clients.map((cl) => cl.ping()));
      return monoNs() - t;
    };
    const warmup = Math.max(100, Math.floor(args.cycles / 10));
    for (let i = 0; i < warmup; i++) {
      await cycle();
      await ping();
    }
    await sleepUntil(startNs);
    while (r.samples.length < args.cycles) {
      const k = Math.min(100, args.cycles - r.samples.length);
      for (let i = 0; i < k; i++) {
        r.samples.push(await cycle());
      }
      for (let i = 0; i < k; i++) {
        r.pings.push(await ping());
      }
    }
  } catch (e) {
    r.errors.push(describe(e));
  }
}

/** The first line of stdin (`go START_NS`); afterwards, the end of stdin exits. */
function readGo() {
  return new Promise((resolve) => {
    let buf = "";
    let started = false;
    process.stdin.setEncoding("utf8");
    process.stdin.on("data", (chunk) => {
      if (started) {
        return;
      }
      buf += chunk;
      const nl = buf.indexOf("\n");
      if (nl >= 0) {
        started = true;
        const line = buf.slice(0, nl).trim();
        if (!line.startsWith("go ")) {
          process.exit(3);
        }
        resolve(BigInt(line.split(/\s+/)[1]));
      }
    });
    process.stdin.on("end", () => process.exit(3));
    process.stdin.on("error", () => process.exit(3));
  });
}

async function main() {
  if (process.argv.includes("--versions")) {
    process.stdout.write(versions() + "\n");
    return;
  }
  const args = parse();
  // Every contender's clients are connected before `ready`.
  const contenders = [];
  const count = args.scenario === "latency" ? 1 : args.tasks;
  for (let task = 0; task < count; task++) {
    const clients = [];
    for (const url of args.urls) {
      clients.push(await connect(url));
    }
    const locker =
      args.lock === "redis-semaphore"
        ? new SemaphoreLocker(args, clients[0])
        : new Locker(args, clients);
    const c = { clients, client: clients[0], locker };
    if (args.scenario === "handoff" || args.scenario === "semaphore-handoff") {
      c.blpop = await connect(args.urls[0]);
    }
    contenders.push(c);
  }
  if (contenders.length > 0) {
    await contenders[0].client.ping();
  }
  process.stdout.write("ready\n");
  const startNs = await readGo();

  const deadlineNs = startNs + BigInt(args.durationMs) * 1000000n;
  const results = contenders.map(() => new Result());
  const running = contenders.map((c, task) => {
    const r = results[task];
    if (args.scenario === "latency") {
      return latency(args, c, startNs, r);
    }
    if (args.scenario === "handoff" || args.scenario === "semaphore-handoff") {
      const g = task * args.procs + args.procIndex;
      const offset =
        (BigInt(g) * BigInt(args.spreadMs) * 1000000n) / BigInt(Math.max(1, args.contenders));
      return handoffTask(args, c, task, startNs + offset, deadlineNs, r);
    }
    return hotKeyTask(args, c, startNs, deadlineNs, r);
  });
  await Promise.all(running);

  const lines = [];
  const total = new Result();
  for (const r of results) {
    if (args.scenario === "hot-key") {
      lines.push(`count ${r.acquisitions}`);
    }
    total.samples.push(...r.samples);
    total.acquisitions += r.acquisitions;
    total.sameProcess += r.sameProcess;
    total.late += r.late;
    if (r.maxWait > total.maxWait) {
      total.maxWait = r.maxWait;
    }
    total.errors.push(...r.errors);
    for (const p of r.pings) {
      lines.push(`ping ${p}`);
    }
  }
  for (const s of total.samples) {
    lines.push(`sample ${s}`);
  }
  lines.push(`stat acquisitions ${total.acquisitions}`);
  lines.push(`stat same_process ${total.sameProcess}`);
  lines.push(`stat late ${total.late}`);
  lines.push(`stat max_wait ${total.maxWait}`);
  for (const e of total.errors) {
    lines.push(`error ${e.replace(/\n/g, " ")}`);
  }
  lines.push("done");
  // Pipes are written synchronously on Linux; exit once the write has gone out.
  process.stdout.write(lines.join("\n") + "\n", () => process.exit(0));
}

main().catch((e) => {
  process.stdout.write(`error ${describe(e).replace(/\n/g, " ")}\ndone\n`, () => process.exit(1));
});
