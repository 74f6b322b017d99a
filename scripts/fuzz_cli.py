#!/usr/bin/env python3
"""Random command lines for tally's planner commands, checked for what a user must never see.

    python3 scripts/fuzz_cli.py TALLY [SECONDS] [--seed N]

Reads each command's flags and their ranges from its --help, then for SECONDS (default 20) runs
the commands with random sets of flags: each value a range's end, one past it, a small count, a
preset or a malformed word — or, in half the runs, each command's required flags and only values
the flags allow, so that more lines reach the ledgers and the search. A finding is a command that
  - dies on a signal or exits other than 0 (answered), 1 (a run failed) or 2 (bad input),
  - prints a sanitizer report (run it on the ASan + UBSan build: scripts/fuzz.sh does),
  - prints nan or inf in its answer, or answers --json with text that is not JSON,
  - exits 2 with other than one line on stderr,
  - runs past 60 s or past 4 GiB of memory (tally's searches take milliseconds; the extrapolated
    pipelines of Note [long pipelines] were found this way).
Each finding is printed as the command line to rerun; the exit status is 1 if there was any.
The seed is printed so a run can be repeated. Python here is a test tool, never a part of tally.
"""
import json
import os
import random
import re
import resource
import subprocess
import sys
import time

COMMANDS = ["memory", "comm", "bubble", "reliability", "plan", "compare", "explain"]
PRESETS = ["seed-7b", "llama-2-70b", "llama-3.1-405b", "mixtral-8x7b", "deepseek-v3",
           "qwen3-30b-a3b", "gpt-oss-120b", "gpt3-175b", "gpt2-124m", "nosuch", "{}"]
GPUS = ["a100-40g", "a100-80g", "h100-80g", "h200", "b200", "gb200-nvl72", "nosuch"]
WORDS = ["1", "0", "x", "", "2,2", "1e9", "-1", "nan"]
QUANTITIES = ["50GB/s", "0GB/s", "1e400GB/s", "-3GB/s", "200Gb/s", "1B/s", "x", "1e-9GB/s", "7GB"]
REQUIRED = {
    "memory": lambda r: ["--model", r.choice(PRESETS[:-2])],
    "comm": lambda r: (["--model", r.choice(PRESETS[:-2])] if r.random() < 0.5 else
                       ["--collective", r.choice(["all-reduce", "all-gather", "all-to-all"]),
                        "--size", r.choice(["1GB", "7GB", "1B"]),
                        "--ranks", r.choice(["2", "64"])]),
    "bubble": lambda r: ["--pp", r.choice(["1", "4", "8", "64"]),
                         "--micro-batches", r.choice(["1", "8", "64", "1024"])],
    "reliability": lambda r: ["--gpus", r.choice(["8", "16384"]), "--state-size",
                              r.choice(["112GB", "1GB", "10TB"])],
}
FLAG = re.compile(r"^\s+(?:-\w,)?(--[\w-]+)\s*(.*)$")
NAN_INF = re.compile(r"(?<![A-Za-z'])-?(nan|inf)(?![A-Za-z'])")
NOT_FUZZED = {"--help", "--help-all", "--html", "--output", "--out"}  # they write files


def parse_flags(tally, command):
    text = subprocess.run([tally, command, "--help"], capture_output=True, text=True).stdout
    flags = []
    for line in text.splitlines():
        m = FLAG.match(line)
        if not m or m.group(1) in NOT_FUZZED:
            continue
        rest = m.group(2)
        kind = re.match(r"(INT|FLOAT|TEXT|QUANTITY)\b", rest)
        flag = {"name": m.group(1), "kind": kind.group(1) if kind else "switch"}
        bounds = re.search(r"in \[([^\]]*)\]", rest)
        if bounds:
            ends = [p for p in re.split(r"\s*,\s*|\s+-\s+", bounds.group(1)) if p.strip()]
            try:
                flag["range"] = [float(ends[0]), float(ends[1])]
            except (ValueError, IndexError):
                pass
        choices = re.match(r"TEXT:\{([^}]*)\}", rest)
        if choices:
            flag["choices"] = [c.strip() for c in choices.group(1).split(",")]
            flag["many"] = "..." in rest
        flags.append(flag)
    return flags


def number(rng, flag, valid):
    lo, hi = flag.get("range", [0.0, 1e6])
    whole = flag["kind"] == "INT"
    r = rng.random()
    if r < 0.25:
        v = lo
    elif r < 0.5:
        v = hi
    elif r < 0.55 and not valid:
        v = hi + 1
    elif r < 0.6 and not valid:
        v = lo - 1
    elif r < 0.85:
        v = min(max(rng.choice([1, 2, 3, 4, 7, 8, 16, 64, 128, 1024]), lo), hi)
    else:
        v = lo + (hi - lo) * rng.random() ** 8
    if whole:
        return str(int(v))
    if rng.random() < 0.05 and not valid:
        return rng.choice(["nan", "inf", "-inf", "1e-320", "0x10", ""])
    return repr(float(v))


def value(rng, flag, valid):
    """A value for the flag; `valid`: only in-range values and known words, so that a command line
    passes parsing more often and reaches the ledgers and the search (half the runs)."""
    name = flag["name"]
    if "choices" in flag:
        if flag.get("many"):
            return ",".join(rng.sample(flag["choices"], rng.randint(1, len(flag["choices"]))))
        return rng.choice(flag["choices"] + ([] if valid else ["nosuch"]))
    if name == "--model":
        return rng.choice(PRESETS[:-2] if valid else PRESETS)
    if name == "--gpu":
        return rng.choice(GPUS[:-1] if valid else GPUS)
    if name == "--params":
        return rng.choice(["7B", "350M", "1e12"] if valid else ["7B", "1", "0", "1e30", "x", "-5"])
    if flag["kind"] == "QUANTITY":
        return rng.choice(QUANTITIES[:1] + QUANTITIES[4:6] if valid else QUANTITIES)
    if flag["kind"] in ("INT", "FLOAT"):
        return number(rng, flag, valid)
    if name == "--pp-layers":
        return rng.choice(["1,1", "5,6,6", "0,4", "80", "", "a", "40,40"])
    return rng.choice(WORDS)


def limit_memory():
    resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))


def address_space_limit(tally):
    """limit_memory, or None where tally cannot start under it (ASan reserves terabytes of shadow
    address space; there ASAN_OPTIONS' hard_rss_limit_mb bounds it instead)."""
    p = subprocess.run([tally, "--version"], capture_output=True, preexec_fn=limit_memory)
    return limit_memory if p.returncode == 0 else None


def check(tally, argv, env, limit):
    """One command line: the finding's name, or None."""
    try:
        p = subprocess.run([tally] + argv, capture_output=True, text=True, env=env, timeout=60,
                           preexec_fn=limit)
    except subprocess.TimeoutExpired:
        return "still running after 60 s"
    if "Sanitizer" in p.stderr or "runtime error" in p.stderr:
        return "sanitizer report: " + p.stderr.strip().splitlines()[0][:200]
    if p.returncode not in (0, 1, 2):
        return f"exit status {p.returncode}: " + (p.stderr.strip().splitlines() or [""])[-1][:200]
    if "out of memory" in p.stderr or "bad_alloc" in p.stderr:
        return "out of memory under a 4 GiB limit"
    if p.returncode == 2 and len(p.stderr.strip().splitlines()) != 1:
        return "exit 2 without a one-line error: " + p.stderr[:300]
    if p.returncode != 2 and NAN_INF.search(p.stdout):
        return "nan or inf in the answer: " + NAN_INF.search(p.stdout).group(0)
    if p.returncode == 0 and "--json" in argv:
        try:
            json.loads(p.stdout)
        except ValueError:
            return "--json answered text that is not JSON"
    return None


def main():
    args = [a for a in sys.argv[1:]]
    seed = int(time.time())
    if "--seed" in args:
        i = args.index("--seed")
        seed = int(args[i + 1])
        del args[i:i + 2]
    if not args:
        sys.exit(__doc__)
    tally, budget = args[0], float(args[1]) if len(args) > 1 else 20.0
    env = dict(os.environ, ASAN_OPTIONS="detect_leaks=1:hard_rss_limit_mb=4096",
               UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1")
    limit = address_space_limit(tally)
    rng = random.Random(seed)
    flags = {c: parse_flags(tally, c) for c in COMMANDS}
    if not all(flags[c] for c in COMMANDS):
        sys.exit(f"fuzz_cli: no flags read from {tally} COMMAND --help")
    start, runs, findings = time.time(), 0, []
    while time.time() - start < budget:
        command = rng.choice(COMMANDS)
        argv = [command]
        if command == "explain" and rng.random() < 0.7:
            argv.append(rng.choice(["errata", "erratum-1", "erratum-4", "erratum-5", "x"]))
        valid = rng.random() < 0.5
        if valid:  # what each command requires, so that the line reaches its ledger
            argv += REQUIRED.get(command, lambda r: [])(rng)
        free = [f for f in flags[command] if f["name"] not in argv]
        for flag in rng.sample(free, min(len(free), rng.randint(0, 8))):
            argv.append(flag["name"])
            if flag["kind"] != "switch":
                argv.append(value(rng, flag, valid))
        if rng.random() < 0.5:
            argv.append("--json")
        runs += 1
        finding = check(tally, argv, env, limit)
        if finding:
            line = " ".join(repr(a) if (not a or " " in a or "{" in a) else a for a in argv)
            findings.append(f"tally {line}\n    {finding}")
            print(findings[-1], flush=True)
    print(f"fuzz_cli: {runs} command lines in {time.time() - start:.0f} s (seed {seed}), "
          f"{len(findings)} finding(s)")
    sys.exit(1 if findings else 0)


if __name__ == "__main__":
    main()
