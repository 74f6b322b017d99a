# PyTorch's own DistributedDataParallel doing what `tally bench ddp` does, step for step
# (tally/engine/bench/ddp.hpp holds the contract): same MLP and init (same seed,
# same weights), same data, same optimizer, same threads, Gloo with bucket_cap_mb = --bucket-mb,
# the same timing (barrier, then forward + backward + optimizer step + zero_grad; slowest rank per
# step; numpy-default quantiles) and the same JSON keys, printed on rank 0 as one line.
#
# Run under `tally launch` (torchrun's environment variables; Debian's torchrun crashes under
# Python 3.11):
#   tally launch --nproc 2 -- /usr/bin/python3 bench/ddp_peer.py --json [flags of tally bench ddp]
import argparse
import datetime
import json
import math
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn


def parse_args(argv):
    p = argparse.ArgumentParser(description="PyTorch DDP peer of `tally bench ddp`")
    p.add_argument("--widths", default="512,1024,1024,1024,16")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--bucket-mb", type=float, default=25.0)
    p.add_argument("--first-bucket-mb", type=float, default=1.0)  # dist._DEFAULT_FIRST_BUCKET_BYTES
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--optimizer", choices=["sgd", "adam"], default="sgd")
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--data-batches", type=int, default=4)
    p.add_argument("--timeout", type=float, default=60.0)
    p.add_argument("--json", action="store_true", help="accepted for symmetry; output is JSON")
    a = p.parse_args(argv)
    a.widths = [int(w) for w in a.widths.split(",")]
    if len(a.widths) < 2 or a.widths[-1] < 2 or a.batch < 1 or a.steps < 1 or a.threads < 1:
        p.error("widths need >= 2 entries ending in >= 2 classes; batch, steps, threads >= 1")
    return a


def build(widths):  # mlp.hpp's make_mlp: nn.Linear init, ReLU between layers
    layers = []
    for i in range(len(widths) - 1):
        layers.append(nn.Linear(widths[i], widths[i + 1]))
        if i + 2 < len(widths):
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


def quantile(samples, q):  # harness.hpp's quantile(): numpy.percentile's linear default
    s = sorted(samples)
    h = q * (len(s) - 1)
    lo = int(math.floor(h))
    if lo + 1 >= len(s):
        return s[-1]
    return s[lo] + (h - lo) * (s[lo + 1] - s[lo])


def main(argv):
    a = parse_args(argv)
    torch.set_num_threads(a.threads)  # step 1
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=a.timeout))
    rank, k = dist.get_rank(), dist.get_world_size()

    torch.manual_seed(a.seed)  # step 2
    model = build(a.widths)
    # step 3: DDP reads the first-bucket limit at construction (its buckets from iteration 2 on).
    dist._DEFAULT_FIRST_BUCKET_BYTES = int(a.first_bucket_mb * 1024 * 1024)
    ddp = nn.parallel.DistributedDataParallel(model, bucket_cap_mb=a.bucket_mb)

    B, glob = a.batch, a.batch * k  # step 4
    torch.manual_seed(a.seed + 1)
    X = torch.randn(a.data_batches, glob, a.widths[0])
    Y = torch.randint(0, a.widths[-1], (a.data_batches, glob))
    xs = [X[p].narrow(0, rank * B, B).contiguous() for p in range(a.data_batches)]
    ys = [Y[p].narrow(0, rank * B, B).contiguous() for p in range(a.data_batches)]

    if a.optimizer == "adam":
        opt = torch.optim.Adam(model.parameters(), lr=a.lr)
    else:
        opt = torch.optim.SGD(model.parameters(), lr=a.lr)

    mine = []  # step 5
    for i in range(a.warmup + a.steps):
        p = i % a.data_batches
        dist.barrier()
        t0 = time.perf_counter()
        loss = nn.functional.cross_entropy(ddp(xs[p]), ys[p])
        loss.backward()  # DDP's reducer all-reduces and waits inside backward
        opt.step()
        opt.zero_grad(set_to_none=True)
        t1 = time.perf_counter()
        if i >= a.warmup:
            mine.append(t1 - t0)

    gathered = [torch.zeros(a.steps, dtype=torch.float64) for _ in range(k)]  # step 6
    dist.all_gather(gathered, torch.tensor(mine, dtype=torch.float64))
    slowest = torch.stack(gathered).max(dim=0).values.tolist()
    median = quantile(slowest, 0.5)

    with torch.no_grad():  # step 7
        final_loss = nn.functional.cross_entropy(model(X[0].contiguous()), Y[0].contiguous()).item()
        param_sum, param_abs_sum = 0.0, 0.0
        for prm in model.parameters():
            p64 = prm.detach().to(torch.float64)
            param_sum += p64.sum().item()
            param_abs_sum += p64.abs().sum().item()
        flat = torch.cat([prm.detach().reshape(-1) for prm in model.parameters()])
        rank0 = flat.clone()
        dist.broadcast(rank0, 0)
        diff = torch.tensor([(flat - rank0).abs().max().item()], dtype=torch.float64)
        dist.all_reduce(diff)

    n_params = sum(prm.numel() for prm in model.parameters())
    if rank == 0:
        print(json.dumps({
            "command": "bench ddp", "impl": "pytorch", "world_size": k, "model": "mlp",
            "widths": a.widths, "parameters": n_params, "batch_per_rank": B,
            "bucket_cap_mb": a.bucket_mb, "first_bucket_mb": a.first_bucket_mb,
            "threads": a.threads, "optimizer": a.optimizer, "lr": a.lr, "seed": a.seed,
            "warmup_steps": a.warmup, "steps": a.steps, "data_batches": a.data_batches,
            "time_convention": "per step the slowest rank's forward+backward+gradient sync+"
                               "optimizer step+zero_grad after a barrier; quantiles over timed steps",
            "step_time_s": {"median": median, "p10": quantile(slowest, 0.1),
                            "p90": quantile(slowest, 0.9), "min": quantile(slowest, 0.0),
                            "max": quantile(slowest, 1.0)},
            "step_times_s": slowest, "samples_per_s": glob / median if median > 0 else 0.0,
            "final_loss": final_loss, "param_sum": param_sum, "param_abs_sum": param_abs_sum,
            "max_param_diff_vs_rank0": diff.item(), "torch_version": torch.__version__,
            "ok": diff.item() == 0.0}), flush=True)
    dist.destroy_process_group()
    return 0 if diff.item() == 0.0 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
