# 文件 ddp_check.py；运行：torchrun --standalone --nproc_per_node=2 ddp_check.py
import torch, torch.nn as nn, torch.distributed as dist
def build():                       # 固定种子 → 每个 rank 拿到同一份初始权重
    torch.manual_seed(1234)
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
def main():
    dist.init_process_group("gloo")            # 有 GPU 时换 "nccl"
    rank, world = dist.get_rank(), dist.get_world_size()
    model = build()
    ddp = nn.parallel.DistributedDataParallel(model)
    torch.manual_seed(7)                       # 固定数据，保证可复现
    X, y = torch.randn(64, 16), torch.randint(0, 4, (64,))
    xb, yb = X[rank::world], y[rank::world]    # 每卡只吃 1/world 份 → 合起来是全批
    nn.functional.cross_entropy(ddp(xb), yb).backward()
    ref = build(); ref.load_state_dict(model.state_dict()); ref.zero_grad()
    nn.functional.cross_entropy(ref(X), y).backward()      # 等效大批的参考梯度
    err = max((p.grad - q.grad).abs().max().item()
              for p, q in zip(model.parameters(), ref.parameters()))
    print(f"[rank {rank}/{world}] max|g_ddp - g_full| = {err:.3e}")
    assert err < 1e-5, "DDP 的同步梯度应等于全批梯度"
    torch.optim.SGD(model.parameters(), lr=0.1).step()
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    ref_flat = flat.clone(); dist.broadcast(ref_flat, src=0)
    assert torch.allclose(flat, ref_flat, atol=0.0), "每步末各副本必须完全一致"
    dist.destroy_process_group()
if __name__ == "__main__":
    main()
