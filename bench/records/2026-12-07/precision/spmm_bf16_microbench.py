import torch, time, numpy as np
torch.set_num_threads(1)
n, m, F = 200_000, 4_000_000, 256
g = torch.Generator().manual_seed(0)
row = torch.randint(0, n, (m,), generator=g); col = torch.randint(0, n, (m,), generator=g)
A = torch.sparse_coo_tensor(torch.stack([row, col]), torch.rand(m, generator=g), (n, n)).coalesce().to_sparse_csr()
crow, ci, v = A.crow_indices(), A.col_indices(), A.values()
x = torch.randn(n, F); xb = x.bfloat16()
def t(f, k=2):
    f(); ts=[]
    for _ in range(k):
        t0=time.perf_counter(); f(); ts.append(time.perf_counter()-t0)
    return min(ts)
out = torch.empty(n, F)
ref = torch.empty(n,F).addmm_(A, x, beta=0)
print("csr fp32", t(lambda: out.addmm_(A, x, beta=0)))
eb = lambda w: torch.nn.functional.embedding_bag(ci, w, crow, mode="sum", per_sample_weights=v.to(w.dtype), include_last_offset=True)
r = eb(xb); print("emb bf16", t(lambda: eb(xb)), (r.float()-ref).abs().max().item(), r.dtype)
r = eb(x); print("emb fp32", t(lambda: eb(x)), (r-ref).abs().max().item())
W = torch.randn(F, F); Wb = W.bfloat16()
print("mm fp32", t(lambda: x @ W)); print("mm bf16", t(lambda: xb @ Wb))
