# SpMM of a neighbour block (48k x 47.8k, 160k entries, width 128) whole vs in 12 message pieces: where the time goes
import torch, time, numpy as np, scipy.sparse as sp, warnings
warnings.filterwarnings("ignore")
torch.set_num_threads(1)
from g3mpi.ops.blocks import _torch, block_pieces, piece_product, spmm, spmm_add
rng = np.random.default_rng(0)
r, c, e, F = 48024, 47851, 159615, 128
m = sp.csr_matrix((rng.random(e).astype(np.float32), (rng.integers(0, r, e), rng.integers(0, c, e))), shape=(r, c)); m.sort_indices()
mat = _torch(m); mt = m.T.tocsr(); mt.sort_indices(); mat_t = _torch(mt)
h = torch.randn(c, F)
bounds = np.linspace(0, c, 13).astype(np.int64)
fwd, bwd = block_pieces(mat, mat_t, bounds)
L = [(p[0].long(), p[1]) for p in fwd]
def T(f, n=7):
    f(); t=time.perf_counter()
    for _ in range(n): f()
    return (time.perf_counter()-t)/n*1e3
def A():
    acc = None
    for k, p in enumerate(fwd): acc = piece_product(acc, p, h[bounds[k]:bounds[k+1]], r)
    return acc
scratch = torch.empty(r, F)
def S():
    acc = torch.zeros(r, F)
    for k, (i, pm) in enumerate(L):
        o = spmm(pm, h[bounds[k]:bounds[k+1]], scratch[:pm.shape[0]])
        acc.index_add_(0, i, o)
    return acc
def SPM():
    for k, (i, pm) in enumerate(L): spmm(pm, h[bounds[k]:bounds[k+1]], scratch[:pm.shape[0]])
def IA():
    acc = torch.zeros(r, F)
    for k, (i, pm) in enumerate(L): acc.index_add_(0, i, scratch[:pm.shape[0]])
Z = lambda: torch.zeros(r, F)
W = lambda: spmm(mat, h)
print("A %.1f S(scratch) %.1f spmm-only %.1f index_add+zeros %.1f zeros %.1f whole %.1f" % (T(A), T(S), T(SPM), T(IA), T(Z), T(W)), torch.equal(A(), S()))
dense = [_torch(m[:, a:b].tocsr()) for a, b in zip(bounds[:-1], bounds[1:])]
def B():
    acc = torch.zeros(r, F)
    for k, d in enumerate(dense): acc.addmm_(d, h[bounds[k]:bounds[k+1]])
    return acc
print("B dense addmm beta1 %.1f" % T(B), torch.equal(B(), A()))
