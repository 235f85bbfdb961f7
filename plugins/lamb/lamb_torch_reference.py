"""DeepSpeed's FusedLamb rule (deepspeed/ops/lamb, its CUDA kernel's arithmetic) written with
PyTorch tensor ops in float64: the oracle of plugins/lamb/lamb_test.cc's LambTorch case.

Reads a JSON list of cases (lr, betas, eps, bias_correction, eps_inside_sqrt, max_coeff,
min_coeff, tensors: [{w0, weight_decay, grads: [step][element]}]) and writes, per case, the
weights after each step: [step][tensor][element].
"""
import json
import sys

import torch


def run(case):
    b1, b2 = case["betas"]
    ws = [torch.tensor(t["w0"], dtype=torch.float64) for t in case["tensors"]]
    ms = [torch.zeros_like(w) for w in ws]
    vs = [torch.zeros_like(w) for w in ws]
    out = []
    for step in range(1, len(case["tensors"][0]["grads"]) + 1):
        if case["bias_correction"]:
            step_size = case["lr"] * (1 - b2 ** step) ** 0.5 / (1 - b1 ** step)
        else:
            step_size = case["lr"]
        for t, spec in enumerate(case["tensors"]):
            g = torch.tensor(spec["grads"][step - 1], dtype=torch.float64)
            ms[t].mul_(b1).add_(g, alpha=1 - b1)
            vs[t].mul_(b2).addcmul_(g, g, value=1 - b2)
            if case["eps_inside_sqrt"]:
                denom = (vs[t] + case["eps"]).sqrt()
            else:
                denom = vs[t].sqrt() + case["eps"]
            update = ms[t] / denom + spec["weight_decay"] * ws[t]
            w_norm, u_norm = ws[t].norm(), update.norm()
            coeff = 1.0
            if w_norm != 0 and u_norm != 0:
                coeff = float(torch.clamp(w_norm / u_norm, case["min_coeff"], case["max_coeff"]))
            ws[t] = ws[t] - step_size * coeff * update
        out.append([w.tolist() for w in ws])
    return out


def main():
    cases = json.load(open(sys.argv[1]))
    json.dump([run(c) for c in cases], open(sys.argv[2], "w"))


if __name__ == "__main__":
    main()
