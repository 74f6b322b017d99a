#!/usr/bin/env python3
"""Start-up cost of the planner's commands (issue 9 goal): `tally --help` <= 10 ms and `tally plan`
on the default scenario <= 50 ms, warm, with resident memory < 30 MB. Runs each command N times
after one warm-up run and prints the median and spread of the wall time and the peak RSS, with a
PASS/MISS against the goal. Usage: python3 bench/startup.py [build/cli/tally] [N]"""
import os
import statistics
import subprocess
import sys
import time

TALLY = sys.argv[1] if len(sys.argv) > 1 else "build/cli/tally"
N = int(sys.argv[2]) if len(sys.argv) > 2 else 30
CASES = [  # (arguments, wall-time goal in ms)
    (["--help"], 10.0),
    (["plan"], 50.0),
    (["plan", "--json"], 50.0),
    (["memory", "--model", "llama-3-70b", "--seq", "8192", "--micro-batch", "1", "--tp", "8"], 50.0),
]
RSS_GOAL_MB = 30.0


def wall_ms(args):
    t0 = time.perf_counter()
    p = subprocess.run([TALLY] + args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    ms = (time.perf_counter() - t0) * 1e3
    if p.returncode != 0:
        sys.exit(f"{' '.join(args)}: exit {p.returncode}: {p.stderr.decode().strip()}")
    return ms


def peak_rss_mb(args):
    """Peak resident set of tally alone, from GNU time's %M (KiB); None without /usr/bin/time.
    (Python's own RUSAGE_CHILDREN would count the interpreter's pages in the forked child.)"""
    if not os.path.exists("/usr/bin/time"):
        return None
    p = subprocess.run(["/usr/bin/time", "-f", "%M", TALLY] + args, stdout=subprocess.DEVNULL,
                       stderr=subprocess.PIPE, text=True)
    return int(p.stderr.strip().splitlines()[-1]) * 1024 / 1e6


def main():
    print(f"{TALLY}, {N} runs each after one warm-up; wall time median [min, max] ms; peak RSS MB")
    print(f"{'command':<58} {'median ms':>10} {'min':>7} {'max':>7} {'RSS MB':>7}  goal")
    ok = True
    for args, goal_ms in CASES:
        wall_ms(args)  # warm the page cache
        walls = [wall_ms(args) for _ in range(N)]
        med = statistics.median(walls)
        rss = peak_rss_mb(args)
        passed = med <= goal_ms and (rss is None or rss < RSS_GOAL_MB)
        ok = ok and passed
        rss_text = f"{rss:7.1f}" if rss is not None else "    n/a"
        print(f"tally {' '.join(args):<52} {med:10.1f} {min(walls):7.1f} {max(walls):7.1f} "
              f"{rss_text}  {'PASS' if passed else 'MISS'} (<= {goal_ms:g} ms, < {RSS_GOAL_MB:g} MB)")
    print("wall time includes Python's process spawn (about 1 ms); RSS from /usr/bin/time %M")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
