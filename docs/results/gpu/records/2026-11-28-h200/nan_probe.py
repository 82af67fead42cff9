"""Diagnostics for the tail's NaN on the GPU: gradients / parameters finite, q/k magnitudes per step."""

import math

import torch
from lightning.pytorch.callbacks import Callback


class NanProbe(Callback):
    def __init__(self):
        self.qk = {}
        self.hooks = []

    def on_train_start(self, trainer, pl_module):
        for name, module in pl_module.named_modules():
            if name.endswith(("q_proj", "k_proj")) and "lora" not in name.split(".")[-1]:
                self.hooks.append(module.register_forward_hook(self._hook(name)))

    def _hook(self, name):
        def hook(module, args, out):
            if isinstance(out, torch.Tensor):
                x = out.detach().float()
                self.qk[name] = (x.abs().amax().item(), torch.isfinite(x).all().item())

        return hook

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.qk.clear()
        import os

        if trainer.global_step >= int(os.environ.get("PROBE_ANOMALY_FROM", "100000")):
            torch.autograd.set_detect_anomaly(True, check_nan=True)

    def on_before_optimizer_step(self, trainer, pl_module, optimizer):
        bad, stats = [], []
        for name, p in pl_module.named_parameters():
            if p.grad is None:
                continue
            g = p.grad.detach().float()
            finite = bool(torch.isfinite(g).all())
            if not finite:
                bad.append((name, int(torch.isnan(g).sum()), int(torch.isinf(g).sum())))
            stats.append((g.norm().item() if finite else math.inf, name, p.detach().float().abs().max().item()))
        stats.sort(key=lambda s: -s[0])
        lrs = [round(group["lr"], 6) for group in optimizer.param_groups]
        print(
            f"probe step={trainer.global_step} tail={pl_module.in_finetune()} lrs={lrs} n_grads={len(stats)} "
            f"bad_grads={len(bad)} {bad[:6]}",
            flush=True,
        )
        print(
            "probe   top grad norm (norm, name, max|p|):",
            [(f"{n:.3g}", nm, f"{pm:.3g}") for n, nm, pm in stats[:5]],
            flush=True,
        )
        if self.qk:
            top = sorted(self.qk.items(), key=lambda kv: -kv[1][0])[:4]
            print("probe   max|q|,|k| proj out:", [(nm, f"{v:.3g}", fin) for nm, (v, fin) in top], flush=True)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        bad = [n for n, p in pl_module.named_parameters() if p.requires_grad and not bool(torch.isfinite(p).all())]
        loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
        loss = loss.item() if isinstance(loss, torch.Tensor) else loss
        print(f"probe after step={trainer.global_step} loss={loss} nonfinite_params={len(bad)} {bad[:6]}", flush=True)
