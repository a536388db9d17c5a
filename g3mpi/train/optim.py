"""The trainer's optimisers: ``torch.optim.Adam`` and ``SGD`` as they run on CPU tensors, without torch's compiler.

``torch.optim``'s optimisers import ``torch._dynamo`` (torch.compile's tracer, with sympy) on their first call, to
keep a compiled graph correct: a third of a g3-train rank's start-up on a small graph (1.2 s of 3.3 on an idle
core, 2.6 s of a 4-rank Cora run on 2 cores), for a compiler g3-train never uses. These classes take the same
arithmetic step by step (torch's single-tensor kernels ``_single_tensor_adam`` / ``_single_tensor_sgd``, what
``torch.optim`` runs for CPU tensors: foreach and fused are CUDA defaults), so parameters after any number of
steps are bit for bit torch's (tested), and the same ``state_dict`` layout, so checkpoints load either way.
Only what g3-train configures: one parameter group; no amsgrad, maximize, nesterov, dampening or closure.
"""
from __future__ import annotations

import torch


class _Optimizer:
    #: the parameter group's settings besides those given, as torch.optim keeps them (state_dict compatibility)
    FIXED: dict = {}

    def __init__(self, params, **group):
        params = list(params)
        if not params:
            raise ValueError("optimizer got an empty parameter list")
        self.param_groups = [dict(group, **self.FIXED, params=params)]
        self.state: dict = {}

    def zero_grad(self, set_to_none: bool = True) -> None:
        """As ``torch.optim.Optimizer.zero_grad``: gradients set to None, or zeroed in place (detached first)."""
        for p in self.param_groups[0]["params"]:
            if p.grad is None:
                continue
            if set_to_none:
                p.grad = None
                continue
            if p.grad.grad_fn is not None:
                p.grad.detach_()
            else:
                p.grad.requires_grad_(False)
            p.grad.zero_()

    def state_dict(self) -> dict:
        """torch.optim's layout: ``state`` by parameter index (only those with a state), ``param_groups`` with the
        indices in place of the parameters."""
        params = self.param_groups[0]["params"]
        index = {id(p): i for i, p in enumerate(params)}
        groups = [{k: v for k, v in g.items() if k != "params"} | {"params": list(range(len(params)))}
                  for g in self.param_groups]
        return {"state": {index[id(p)]: dict(s) for p, s in self.state.items() if id(p) in index},
                "param_groups": groups}

    def load_state_dict(self, sd: dict) -> None:
        """A state_dict of this optimiser or of torch.optim's: the group's settings and each parameter's state
        (floating-point tensors cast to the parameter's dtype, ``step`` kept as it is, as torch.optim does)."""
        groups = sd["param_groups"]
        mine = self.param_groups
        if len(groups) != len(mine) or any(len(g["params"]) != len(o["params"]) for g, o in zip(groups, mine)):
            raise ValueError("loaded state dict has a different number of parameter groups or parameters")
        params = {pid: p for g, o in zip(groups, mine) for pid, p in zip(g["params"], o["params"])}
        state = {}
        for pid, st in sd["state"].items():
            p = params[pid]
            state[p] = {k: (v.to(dtype=p.dtype, device=p.device)
                            if torch.is_tensor(v) and k != "step" and v.is_floating_point() else v)
                        for k, v in st.items()}
        self.state = state
        self.param_groups = [{k: v for k, v in g.items() if k != "params"} | {"params": o["params"]}
                             for g, o in zip(groups, mine)]


class Adam(_Optimizer):
    """``torch.optim.Adam(params, lr, betas, eps, weight_decay)`` (L2 weight decay added to the gradient)."""

    FIXED = dict(amsgrad=False, maximize=False, foreach=None, capturable=False, differentiable=False, fused=None,
                 decoupled_weight_decay=False)

    def __init__(self, params, lr: float = 1e-3, betas: tuple = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0.0):
        super().__init__(params, lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay)

    @torch.no_grad()
    def step(self) -> None:
        g = self.param_groups[0]
        lr, (beta1, beta2), eps, wd = g["lr"], g["betas"], g["eps"], g["weight_decay"]
        for p in g["params"]:
            if p.grad is None:
                continue
            st = self.state.get(p)
            if st is None:
                st = self.state[p] = dict(step=torch.tensor(0.0, dtype=torch.float32),
                                          exp_avg=torch.zeros_like(p, memory_format=torch.preserve_format),
                                          exp_avg_sq=torch.zeros_like(p, memory_format=torch.preserve_format))
            grad, exp_avg, exp_avg_sq = p.grad, st["exp_avg"], st["exp_avg_sq"]
            st["step"] += 1
            if wd != 0:
                grad = grad.add(p, alpha=wd)
            exp_avg.lerp_(grad, 1 - beta1)
            exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
            step = st["step"].item()
            bias_correction1 = 1 - beta1 ** step
            bias_correction2 = 1 - beta2 ** step
            step_size = lr / bias_correction1
            denom = (exp_avg_sq.sqrt() / bias_correction2 ** 0.5).add_(eps)
            p.addcdiv_(exp_avg, denom, value=-step_size)


class SGD(_Optimizer):
    """``torch.optim.SGD(params, lr, momentum, weight_decay)`` (no dampening, not Nesterov)."""

    FIXED = dict(dampening=0, nesterov=False, maximize=False, foreach=None, differentiable=False, fused=None)

    def __init__(self, params, lr: float, momentum: float = 0.0, weight_decay: float = 0.0):
        super().__init__(params, lr=lr, momentum=momentum, weight_decay=weight_decay)

    @torch.no_grad()
    def step(self) -> None:
        g = self.param_groups[0]
        lr, momentum, wd = g["lr"], g["momentum"], g["weight_decay"]
        for p in g["params"]:
            if p.grad is None:
                continue
            grad = p.grad
            if wd != 0:
                grad = grad.add(p, alpha=wd)
            if momentum != 0:
                st = self.state.setdefault(p, {})
                buf = st.get("momentum_buffer")
                if buf is None:
                    buf = st["momentum_buffer"] = grad.detach().clone()
                else:
                    buf.mul_(momentum).add_(grad, alpha=1 - g["dampening"])
                grad = buf
            p.add_(grad, alpha=-lr)
