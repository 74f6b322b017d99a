# Companion of ddp_check.py (the seed's, verbatim, next to this file): the same DDP step with
# PyTorch's own DistributedDataParallel over Gloo, printing the averaged gradients as one JSON line
# on rank 0, so tests/engine/exp_ddp_check.cpp can compare them with `tally run ddp-check --json
# --grads` on the same model and data. Run: tally launch --nproc 2 -- /usr/bin/python3 ddp_grads.py
import json
import torch, torch.nn as nn, torch.distributed as dist


def build():
    torch.manual_seed(1234)
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))


def main():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    model = build()
    initial = torch.cat([p.detach().reshape(-1) for p in model.parameters()]).tolist()
    ddp = nn.parallel.DistributedDataParallel(model)
    torch.manual_seed(7)
    X, y = torch.randn(64, 16), torch.randint(0, 4, (64,))
    xb, yb = X[rank::world], y[rank::world]
    nn.functional.cross_entropy(ddp(xb), yb).backward()
    grads = torch.cat([p.grad.reshape(-1) for p in model.parameters()]).tolist()
    if rank == 0:
        names = [n for n, _ in model.named_parameters()]
        print(json.dumps({"world_size": world, "parameter_names": names,
                          "initial_parameters": initial, "averaged_gradients": grads}),
              flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
