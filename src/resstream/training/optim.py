"""AdamW parameter groups and the warmup + cosine learning-rate schedule."""

from __future__ import annotations

import math

import torch
from torch import nn

from resstream.training.config import OptimConfig


def param_groups(model: nn.Module, config: OptimConfig) -> list[dict]:
    """Three groups: matrices (decayed), gains and biases (not decayed), gate parameters
    (not decayed, own learning rate). Each group records `base_lr` for the schedule."""
    gate = getattr(model, "gate", None)
    gate_ids = {id(p) for p in gate.parameters()} if isinstance(gate, nn.Module) else set()
    decay, no_decay, gate = [], [], []
    for param in model.parameters():
        if not param.requires_grad:
            continue
        if id(param) in gate_ids:
            gate.append(param)
        elif param.dim() >= 2:
            decay.append(param)
        else:
            no_decay.append(param)
    groups = [
        {"params": decay, "weight_decay": config.weight_decay, "base_lr": config.lr, "name": "decay"},
        {"params": no_decay, "weight_decay": 0.0, "base_lr": config.lr, "name": "no_decay"},
        {"params": gate, "weight_decay": 0.0, "base_lr": config.gate_lr, "name": "gate"},
    ]
    return [g for g in groups if g["params"]]


def make_optimizer(model: nn.Module, config: OptimConfig, *, fused: bool = False) -> torch.optim.AdamW:
    """AdamW over `param_groups`; `fused` uses the fused CUDA kernel."""
    groups = param_groups(model, config)
    kwargs = {"fused": True} if fused else {}
    return torch.optim.AdamW(groups, lr=config.lr, betas=(config.beta1, config.beta2), **kwargs)


def lr_scale(step: int, *, warmup_steps: int, max_steps: int, min_ratio: float) -> float:
    """Multiplier of the base learning rate at `step`: linear warmup, then cosine to `min_ratio`."""
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    if max_steps <= warmup_steps:
        return 1.0
    progress = min(1.0, (step - warmup_steps) / (max_steps - warmup_steps))
    return min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


def set_lr(optimizer: torch.optim.Optimizer, scale: float) -> None:
    """Apply the schedule multiplier to every group's base learning rate."""
    for group in optimizer.param_groups:
        group["lr"] = group["base_lr"] * scale


def apply_optim_config(optimizer: torch.optim.Optimizer, config: OptimConfig) -> None:
    """Set every group's hyper-parameters from `config` (after loading a checkpoint's state,
    whose groups carry the values it was saved with)."""
    for group in optimizer.param_groups:
        is_gate = group.get("name") == "gate"
        group["base_lr"] = config.gate_lr if is_gate else config.lr
        group["betas"] = (config.beta1, config.beta2)
        if group.get("name") == "decay":
            group["weight_decay"] = config.weight_decay
