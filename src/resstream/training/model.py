"""GPT-2-style decoder whose blocks scale their identity path by α from an injected gate.

Pre-norm (default):  y = α_l·x + attn(ln1(x));   out = y + mlp(ln2(y))
Post-norm:           y = ln1(α_l·x + attn(x));   out = ln2(y + mlp(y))

Embeddings are tied (the unembedding is `wte.weight`). Residual output projections
(`attn.c_proj`, `mlp.c_proj`) are initialised with std 0.02/√(2·n_layer), the rest with 0.02.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from resstream.training.budget import flops_per_token
from resstream.training.config import ModelConfig
from resstream.training.gates import ResidualGate, make_gate

INIT_STD = 0.02


def make_norm(config: ModelConfig) -> nn.Module:
    """LayerNorm (with or without bias), RMSNorm, or none (identity) of width d_model."""
    if config.norm == "none":
        return nn.Identity()
    if config.norm == "rmsnorm":
        return nn.RMSNorm(config.d_model, eps=1e-5)
    return nn.LayerNorm(config.d_model, eps=1e-5, bias=config.bias)


class Rotary(nn.Module):
    """Rotary position embedding (half-split layout) applied to queries and keys."""

    cos: Tensor  # (max_len, head_dim / 2): buffers, not saved with the weights
    sin: Tensor

    def __init__(self, head_dim: int, max_len: int, base: float = 10000.0) -> None:
        super().__init__()
        inv_freq = 1.0 / base ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
        angles = torch.outer(torch.arange(max_len, dtype=torch.float32), inv_freq)
        self.register_buffer("cos", angles.cos(), persistent=False)
        self.register_buffer("sin", angles.sin(), persistent=False)

    def forward(self, x: Tensor) -> Tensor:
        """Rotate x of shape (batch, heads, seq, head_dim)."""
        seq = x.shape[-2]
        cos, sin = self.cos[:seq].to(x.dtype), self.sin[:seq].to(x.dtype)
        x1, x2 = x.chunk(2, dim=-1)
        return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention through `scaled_dot_product_attention`."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.n_head = config.n_head
        self.head_dim = config.d_model // config.n_head
        self.c_attn = nn.Linear(config.d_model, 3 * config.d_model, bias=config.bias)
        self.c_proj = nn.Linear(config.d_model, config.d_model, bias=config.bias)
        self.dropout = config.dropout
        self.resid_dropout = nn.Dropout(config.dropout)
        self.rotary = Rotary(self.head_dim, config.block_size) if config.pos_emb == "rotary" else None

    def _heads(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """q, k, v of x (batch, seq, d_model) as (batch, heads, seq, head_dim), rotary applied."""
        batch, seq, width = x.shape
        q, k, v = self.c_attn(x).split(width, dim=2)
        q, k, v = (t.view(batch, seq, self.n_head, self.head_dim).transpose(1, 2) for t in (q, k, v))
        if self.rotary is not None:
            q, k = self.rotary(q), self.rotary(k)
        return q, k, v

    def attention_probs(self, x: Tensor) -> Tensor:
        """The attention probabilities (batch, heads, query, key) that `forward` applies to x,
        computed explicitly in fp32 (no dropout): softmax(causal(q·kᵀ/√head_dim))."""
        q, k, _ = self._heads(x)
        scores = (q.float() @ k.float().transpose(-1, -2)) / math.sqrt(self.head_dim)
        seq = x.shape[1]
        future = torch.ones(seq, seq, dtype=torch.bool, device=x.device).triu(1)
        return scores.masked_fill(future, float("-inf")).softmax(dim=-1)

    def forward(self, x: Tensor) -> Tensor:
        batch, seq, width = x.shape
        q, k, v = self._heads(x)
        y = F.scaled_dot_product_attention(
            q, k, v, is_causal=True, dropout_p=self.dropout if self.training else 0.0
        )
        y = y.transpose(1, 2).contiguous().view(batch, seq, width)
        return self.resid_dropout(self.c_proj(y))


class MLP(nn.Module):
    """Two-layer GELU feed-forward network."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.c_fc = nn.Linear(config.d_model, config.mlp_width, bias=config.bias)
        self.c_proj = nn.Linear(config.mlp_width, config.d_model, bias=config.bias)
        self.dropout = nn.Dropout(config.dropout)

    @staticmethod
    def act(x: Tensor) -> Tensor:
        """The activation: GELU, tanh approximation (as GPT-2)."""
        return F.gelu(x, approximate="tanh")

    def forward(self, x: Tensor) -> Tensor:
        return self.dropout(self.c_proj(self.act(self.c_fc(x))))


class Block(nn.Module):
    """One Transformer block; `alpha` scales the identity path around attention."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.pre_norm = config.norm_position == "pre"
        self.ln1 = make_norm(config)
        self.attn = CausalSelfAttention(config)
        self.ln2 = make_norm(config)
        self.mlp = MLP(config)

    def forward(self, x: Tensor, alpha: Tensor | None = None) -> Tensor:
        attn_out = self.attn(self.ln1(x) if self.pre_norm else x)
        y = scaled_residual(x, attn_out, alpha)
        if self.pre_norm:
            return y + self.mlp(self.ln2(y))
        y = self.ln1(y)
        return self.ln2(y + self.mlp(y))


def scaled_residual(x: Tensor, update: Tensor, alpha: Tensor | None) -> Tensor:
    """α·x + update in one fused pass (x + update when α is None)."""
    if alpha is None:
        return x + update
    return torch.addcmul(update, alpha, x)


class GPT(nn.Module):
    """The resstream decoder: embeddings, gated blocks, final norm, tied unembedding."""

    def __init__(self, config: ModelConfig, gate: ResidualGate | None = None) -> None:
        super().__init__()
        if config.vocab_size <= 0:
            raise ValueError("config.vocab_size must be resolved (> 0) before building a model")
        self.config = config
        self.wte = nn.Embedding(config.vocab_size, config.d_model)
        self.wpe = nn.Embedding(config.block_size, config.d_model) if config.pos_emb == "learned" else None
        self.drop = nn.Dropout(config.dropout)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.n_layer))
        self.final_norm = make_norm(config) if config.norm_position == "pre" else nn.Identity()
        # The gate draws no random numbers, so every gate variant gets the same weights.
        with torch.random.fork_rng(devices=[]):
            self.gate = gate if gate is not None else make_gate(config)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """GPT-2 initialisation with scaled residual projections; gates start uniform (no RNG)."""
        residual_std = INIT_STD / math.sqrt(2 * self.config.n_layer)
        for name, module in self.named_modules():
            if name.startswith("gate"):
                continue
            if isinstance(module, (nn.Linear, nn.Embedding)):
                std = residual_std if name.endswith("c_proj") else INIT_STD
                nn.init.normal_(module.weight, mean=0.0, std=std)
                bias = getattr(module, "bias", None)  # an Embedding has none; a Linear may have None
                if isinstance(bias, Tensor):
                    nn.init.zeros_(bias)
        reset_gate = getattr(self.gate, "reset_parameters", None)
        if reset_gate is not None:
            reset_gate()

    @property
    def W_U(self) -> Tensor:
        """Unembedding matrix (vocab × d_model); tied to the token embedding."""
        return self.wte.weight

    def embed(self, idx: Tensor) -> Tensor:
        """h_0: token (+ learned position) embeddings, the input of block 0."""
        seq = idx.shape[1]
        if seq > self.config.block_size:
            raise ValueError(f"sequence length {seq} exceeds block_size {self.config.block_size}")
        h = self.wte(idx)
        if self.wpe is not None:
            h = h + self.wpe(torch.arange(seq, device=idx.device))
        return self.drop(h)

    def hidden_states(self, idx: Tensor) -> list[Tensor]:
        """[h_0, h_1, ..., h_L]: the residual stream before the final norm."""
        h = self.embed(idx)
        states = [h]
        for block, alpha in zip(self.blocks, self.gate(h), strict=True):
            h = block(h, alpha)
            states.append(h)
        return states

    def forward(self, idx: Tensor, targets: Tensor | None = None) -> tuple[Tensor, Tensor | None]:
        """Logits (batch, seq, vocab) and, given targets, the mean cross-entropy."""
        h = self.hidden_states(idx)[-1]
        logits = F.linear(self.final_norm(h), self.wte.weight)
        if targets is None:
            return logits, None
        loss = F.cross_entropy(logits.float().flatten(0, 1), targets.flatten(), ignore_index=-1)
        return logits, loss

    def num_params(self, *, include_embeddings: bool = True) -> int:
        """Parameter count (tied weights counted once)."""
        total = sum(p.numel() for p in self.parameters())
        if not include_embeddings and self.wpe is not None:
            total -= self.wpe.weight.numel()
        return total

    def flops_per_token(self) -> float:
        """Training FLOPs per token (forward + backward): 6·N + 12·L·d·T (PaLM appendix B),
        from the config (`resstream.training.budget.flops_per_token`)."""
        return flops_per_token(self.config)
