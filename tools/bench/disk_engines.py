"""`python -m tools.bench.disk_engines`: RocksDB (rocksdict) against LMDB as the disk state store's engine (issue 32).

The shape of the pipeline's use: --keys keys "account-<8 digits>" -> "[count,sum]" written in batches of --batch
(one committed transaction each: one atomic write batch, with a checkpoint key), then --reads random point reads,
then the same batches again as updates of existing keys. Each engine in a fresh process; reported: seconds per
phase, the directory's size on disk and the process's peak RSS. Not a timed test.

    .venv/bin/pip install lmdb   # the rejected engine is in no lock: install it to compare
    python -m tools.bench.disk_engines --keys 1000000
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import shutil
import subprocess
import sys
import tempfile
import time


def _key(i: int) -> bytes:
    return b"account-%08d" % i


def _dir_bytes(path: str) -> int:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs)


def _rocks(path: str, keys: int, batch: int, reads: int) -> dict[str, float]:
    import rocksdict

    options = rocksdict.Options(raw_mode=True)
    options.create_if_missing(True)
    db = rocksdict.Rdict(path, options)
    times = {}
    for phase in ("insert", "update"):
        start = time.perf_counter()
        for base in range(0, keys, batch):
            wb = rocksdict.WriteBatch(raw_mode=True)
            for i in range(base, min(keys, base + batch)):
                wb.put(_key(i), b"[1,%d]" % i)
            wb.put(b"\x00checkpoint", b"%d" % base)
            db.write(wb)
        times[phase] = time.perf_counter() - start
    rng = random.Random(1)
    start = time.perf_counter()
    for _ in range(reads):
        db.get(_key(rng.randrange(keys)))
    times["reads"] = time.perf_counter() - start
    db.close()
    return times


def _lmdb(path: str, keys: int, batch: int, reads: int) -> dict[str, float]:
    import lmdb

    env = lmdb.open(path, map_size=64 << 30, sync=True)
    times = {}
    for phase in ("insert", "update"):
        start = time.perf_counter()
        for base in range(0, keys, batch):
            with env.begin(write=True) as txn:
                for i in range(base, min(keys, base + batch)):
                    txn.put(_key(i), b"[1,%d]" % i)
                txn.put(b"\x00checkpoint", b"%d" % base)
        times[phase] = time.perf_counter() - start
    rng = random.Random(1)
    start = time.perf_counter()
    with env.begin() as txn:
        for _ in range(reads):
            txn.get(_key(rng.randrange(keys)))
    times["reads"] = time.perf_counter() - start
    env.close()
    return times


def _one(engine: str, keys: int, batch: int, reads: int) -> None:
    path = tempfile.mkdtemp(prefix=f"bench-{engine}-", dir=os.environ.get("BENCH_DIR"))
    try:
        times = (_rocks if engine == "rocksdict" else _lmdb)(path, keys, batch, reads)
        times["disk_mb"] = _dir_bytes(path) / 1e6
        times["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e3
        print(json.dumps({"engine": engine, **{k: round(v, 2) for k, v in times.items()}}))
    finally:
        shutil.rmtree(path, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--keys", type=int, default=1_000_000)
    parser.add_argument("--batch", type=int, default=1000)
    parser.add_argument("--reads", type=int, default=300_000)
    parser.add_argument("--one", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        _one(args.one, args.keys, args.batch, args.reads)
        return
    for engine in ("rocksdict", "lmdb"):
        cmd = [sys.executable, "-m", "tools.bench.disk_engines", "--one", engine]
        cmd += ["--keys", str(args.keys), "--batch", str(args.batch), "--reads", str(args.reads)]
        subprocess.run(cmd, check=True)


if __name__ == "__main__":
    main()
