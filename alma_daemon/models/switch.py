"""A decoder-only Switch Transformer language model (Fedus et al. 2021), nanoGPT-sized.

Every block's FFN is a Switch layer: a router sends each token to ONE expert FFN (top-1), so the
compute per token does not depend on the number of experts. During training each expert takes at
most ``capacity = ceil(capacity_factor * tokens / experts)`` tokens of a batch; the rest skip the
FFN through the residual connection. At evaluation there is no capacity limit, so a token's output
never depends on the other sequences of its batch (perplexities do not depend on the batch size).

FLOPs per token of the forward pass (one multiply-add = 2 FLOPs; layer norms, softmaxes, GELUs
and the embedding lookups left out), for width d, FFN width f, sequence length L, vocabulary V:

    per block: 8 d^2 (q, k, v, output projections) + 4 L d (scores and weighted sum, the causal
               mask is not exploited) + 4 d f (one expert) + 2 d E (router)
    output layer (tied to the embedding): 2 d V

The backward pass costs about twice the forward. For the example config (d=128, f=512, L=64,
V=10k, 2 blocks) the output layer is 2.6 of the 3.4 MFLOPs per token: on PTB the softmax
over the vocabulary, not the experts, dominates. The engine does not use this formula: it counts
real steps with ``FlopCounterMode``. That is why attention is written out with matmuls:
``scaled_dot_product_attention`` on the CPU is invisible to the counter (it reports 0 FLOPs). On
CUDA the counter sees the fused attention kernels, which attention without dropout uses there.
"""

from __future__ import annotations

import copy
import math
from collections import OrderedDict
from dataclasses import dataclass
from typing import NamedTuple, cast

import torch
import torch.nn.functional as F
from torch import nn

from alma_daemon.models.noise import SeededDropout


@dataclass(frozen=True)
class SwitchLMConfig:
    """Shape of a :class:`SwitchLM`."""

    vocab_size: int
    block_size: int  # longest sequence (positions with a learned embedding)
    d_model: int = 128
    heads: int = 4
    d_ff: int = 512  # width of each expert's hidden layer
    experts: tuple[int, ...] = (4, 4)  # experts of each block's Switch layer; its length is the depth
    dropout: float = 0.1
    capacity_factor: float = 1.0


class LMOutput(NamedTuple):
    """What a forward pass returns besides the logits: the routing, for the loss and for growth."""

    logits: torch.Tensor  # (batch, length, vocab)
    balance_loss: torch.Tensor  # scalar, the load-balancing loss averaged over blocks
    routes: list[torch.Tensor]  # per block: each token's expert (batch * length), -1 = over capacity


def balance_loss(probs: torch.Tensor, expert: torch.Tensor) -> torch.Tensor:
    """``E * sum_i f_i * P_i`` (Fedus et al. eq. 4): 1 for uniform routing, up to E when one expert takes all.

    ``f_i`` is the share of tokens whose top-1 choice is expert i (before capacity drops) and ``P_i``
    the mean router probability of expert i; only ``P`` carries a gradient.
    """
    experts = probs.shape[-1]
    dispatched = F.one_hot(expert, experts).float().mean(0)
    return experts * (dispatched * probs.mean(0)).sum()


class SwitchFFN(nn.Module):
    """A Switch layer: top-1 routing (router in fp32) over expert FFNs, with a capacity limit in training.

    ``gate_scale`` (1 per expert until growth) multiplies the router probabilities; routing takes the
    argmax of the scaled gates and the chosen expert's output is multiplied by its scaled gate. It is
    what makes :meth:`split_experts` exact, see there.
    """

    router: nn.Linear
    experts: nn.ModuleList
    gate_scale: torch.Tensor

    def __init__(self, d_model: int, d_ff: int, experts: int, capacity_factor: float, dropout: float):
        super().__init__()
        self.capacity_factor = capacity_factor
        self.router = nn.Linear(d_model, experts)
        self.experts = nn.ModuleList(
            nn.Sequential(OrderedDict(fc=nn.Linear(d_model, d_ff), gelu=nn.GELU(), proj=nn.Linear(d_ff, d_model)))
            for _ in range(experts)
        )
        self.register_buffer("gate_scale", torch.ones(experts))
        self.dropout = SeededDropout(dropout)

    def capacity(self, tokens: int) -> int:
        return math.ceil(self.capacity_factor * tokens / len(self.experts))

    def within_capacity(self, expert: torch.Tensor) -> torch.Tensor:
        """Which tokens fit: each expert keeps its first ``capacity`` tokens in batch order."""
        if not self.training:
            return torch.ones_like(expert, dtype=torch.bool)
        # Experts x tokens, so the running count runs along contiguous memory: a scan down the
        # columns of a tokens x experts matrix took a quarter of a GPU step at 16k tokens.
        onehot = (expert == torch.arange(len(self.experts), device=expert.device)[:, None]).long()
        rank = (onehot.cumsum(1) * onehot).sum(0)  # 1-based position in the expert's queue
        return rank <= self.capacity(len(expert))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        shape = x.shape
        x = x.reshape(-1, shape[-1])
        # fp32 router even under mixed precision: bf16 softmaxes make routing unstable (Fedus et al. 2.4).
        # Autocast would cast the router's matmul to bf16 whatever its inputs are, so it is off here.
        with torch.autocast(x.device.type, enabled=False):
            logits = F.linear(x.float(), self.router.weight.float(), self.router.bias.float())
            probs = logits.softmax(-1)
        gate, expert = (probs * self.gate_scale).max(-1)
        route = torch.where(self.within_capacity(expert), expert, -1)
        # Both dispatches compute the same outputs (up to rounding). Eager runs the grouped one, which
        # computes only the tokens that fit; torch.compile cannot trace its data-dependent group sizes.
        dispatch = self.dispatch_in_slots if torch.compiler.is_compiling() else self.dispatch_in_groups
        out = dispatch(x, route, gate)
        return self.dropout(out).reshape(shape), balance_loss(probs, expert), route

    def dispatch_in_groups(self, x: torch.Tensor, route: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        """Each expert's FFN on the tokens routed to it, times their gates; dropped tokens (route -1) get zeros.

        Tokens are grouped by expert, in batch order within each group (a stable sort): one read of
        the group sizes per layer instead of one host synchronization per expert.
        """
        out = torch.zeros_like(x)  # dropped tokens add nothing: the residual carries them
        order = torch.argsort(route, stable=True)
        sizes = torch.bincount(route + 1, minlength=len(self.experts) + 1).tolist()
        for ffn, index in zip(self.experts, order.split(sizes)[1:]):
            out.index_add_(0, index, ffn(x[index]) * gate[index, None].to(x.dtype))
        return out

    def dispatch_in_slots(self, x: torch.Tensor, route: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        """What :meth:`dispatch_in_groups` computes, with shapes that depend on the token count alone.

        Every expert gets ``slots`` rows (its capacity in training, every token in evaluation), filled
        in batch order and padded with zeros, and all experts run as two batched matmuls: no host
        synchronization and no data-dependent shape, so a compiler traces one graph. The padding rows
        are computed and thrown away.
        """
        tokens, width = x.shape
        experts = len(self.experts)
        slots = self.capacity(tokens) if self.training else tokens
        kept = route >= 0
        onehot = (route == torch.arange(experts, device=x.device)[:, None]).long()
        place = (onehot.cumsum(1) * onehot).sum(0) - 1  # 0-based position in the expert's queue
        # A dropped token gets a slot of its own past the experts' slots, so no two tokens share one.
        slot = torch.where(kept, route * slots + place, experts * slots + torch.arange(tokens, device=x.device))
        holder = torch.full((experts * slots + tokens,), tokens, dtype=torch.long, device=x.device)
        holder.scatter_(0, slot, torch.arange(tokens, device=x.device))
        padded = torch.cat([x, x.new_zeros(1, width)])
        inputs = padded[holder[: experts * slots]].view(experts, slots, width)
        hidden = F.gelu(_batched_linear(inputs, self.expert_layers("fc")))
        outputs = _batched_linear(hidden, self.expert_layers("proj")).reshape(experts * slots, width)
        picked = outputs[slot.clamp(max=experts * slots - 1)].to(x.dtype) * gate[:, None].to(x.dtype)
        return torch.where(kept[:, None], picked, 0.0)

    def expert_layers(self, name: str) -> list[nn.Linear]:
        """Every expert's layer ``name`` ("fc" or "proj"), in expert order."""
        return [cast(nn.Linear, ffn.get_submodule(name)) for ffn in self.experts]

    @torch.no_grad()
    def split_experts(self, chosen: list[int]) -> None:
        """Append a copy of each chosen expert (FFN and router row); the layer's function is unchanged.

        Why exact: the copy's router row equals the original's, and both biases drop by log 2, so the
        softmax denominator is unchanged (``2 exp(z - log 2) = exp(z)``): every other expert keeps its
        probability and the pair share the original's probability half and half. Doubling the pair's
        ``gate_scale`` restores each one's scaled gate to the original's value, so the argmax over scaled
        gates picks the same token-expert pairs (a tie between original and copy goes to the first
        index, the original; either way the FFN weights are identical) and the output is multiplied by
        the same gate. Only the training-time capacity changes, since it divides by the new count.
        """
        old = self.router
        index = torch.tensor(chosen, dtype=torch.long, device=old.weight.device)
        self.router = nn.Linear(old.in_features, old.out_features + len(chosen)).to(old.weight.device)
        self.router.weight.copy_(torch.cat([old.weight, old.weight[index]]))
        bias = torch.cat([old.bias, old.bias[index]])
        scale = torch.cat([self.gate_scale, self.gate_scale[index]])
        copies = torch.arange(old.out_features, old.out_features + len(chosen), device=index.device)
        for pair in (index, copies):
            bias[pair] -= math.log(2.0)
            scale[pair] *= 2.0
        self.router.bias.copy_(bias)
        self.gate_scale = scale
        self.experts.extend(copy.deepcopy(self.experts[e]) for e in chosen)


def _batched_linear(x: torch.Tensor, layers: list[nn.Linear]) -> torch.Tensor:
    """``layers[e](x[e])`` for every e, as one batched matmul over the stacked weights."""
    weight = torch.stack([layer.weight for layer in layers])
    bias = torch.stack([layer.bias for layer in layers])
    return torch.baddbmm(bias[:, None, :], x, weight.transpose(1, 2))


class CausalSelfAttention(nn.Module):
    """Multi-head attention over earlier positions only."""

    mask: torch.Tensor

    def __init__(self, config: SwitchLMConfig):
        super().__init__()
        self.heads = config.heads
        self.qkv = nn.Linear(config.d_model, 3 * config.d_model)
        self.proj = nn.Linear(config.d_model, config.d_model)
        self.attn_dropout = SeededDropout(config.dropout)
        self.resid_dropout = SeededDropout(config.dropout)
        mask = torch.ones(config.block_size, config.block_size, dtype=torch.bool).tril()
        self.register_buffer("mask", mask, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, width = x.shape
        q, k, v = (t.view(batch, length, self.heads, -1).transpose(1, 2) for t in self.qkv(x).split(width, 2))
        if x.is_cuda and (not self.training or self.attn_dropout.p == 0.0):
            # The fused kernel never writes the length x length scores to memory; the FLOP counter
            # sees it on CUDA (the same count as the matmuls below) but not on the CPU. Its
            # dropout would draw from the global RNG, so it runs only where there is none.
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            scores = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
            scores = scores.masked_fill(~self.mask[:length, :length], float("-inf"))
            y = self.attn_dropout(scores.softmax(-1)) @ v
        return self.resid_dropout(self.proj(y.transpose(1, 2).reshape(batch, length, width)))


class Block(nn.Module):
    """Pre-norm transformer block whose FFN is a Switch layer."""

    def __init__(self, config: SwitchLMConfig, experts: int):
        super().__init__()
        self.ln_attn = nn.LayerNorm(config.d_model)
        self.attn = CausalSelfAttention(config)
        self.ln_ffn = nn.LayerNorm(config.d_model)
        self.ffn = SwitchFFN(config.d_model, config.d_ff, experts, config.capacity_factor, config.dropout)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        x = x + self.attn(self.ln_attn(x))
        h, balance, route = self.ffn(self.ln_ffn(x))
        return x + h, balance, route


class SwitchLM(nn.Module):
    """Token ids (batch, length) -> next-token logits; output layer tied to the token embedding."""

    def __init__(self, config: SwitchLMConfig):
        super().__init__()
        self.config = config
        self.wte = nn.Embedding(config.vocab_size, config.d_model)
        self.wpe = nn.Embedding(config.block_size, config.d_model)
        self.dropout = SeededDropout(config.dropout)
        self.blocks = nn.ModuleList(Block(config, experts) for experts in config.experts)
        self.ln_f = nn.LayerNorm(config.d_model)
        self.head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        self.head.weight = self.wte.weight
        self.apply(_init_weights)
        # GPT-2: residual projections scaled down with depth so the residual stream's variance stays put.
        for name, p in self.named_parameters():
            if name.endswith("proj.weight"):
                nn.init.normal_(p, std=0.02 / math.sqrt(2 * len(config.experts)))

    def forward(self, idx: torch.Tensor) -> LMOutput:
        positions = torch.arange(idx.shape[1], device=idx.device)
        x = self.dropout(self.wte(idx) + self.wpe(positions))
        balances, routes = [], []
        for block in self.blocks:
            x, balance, route = block(x)
            balances.append(balance)
            routes.append(route)
        return LMOutput(self.head(self.ln_f(x)), torch.stack(balances).mean(), routes)

    def switch_layers(self) -> list[SwitchFFN]:
        """Each block's Switch layer, in order."""
        layers = []
        for block in self.blocks:
            assert isinstance(block, Block)  # blocks holds nothing else
            layers.append(block.ffn)
        return layers


def _init_weights(module: nn.Module) -> None:
    if isinstance(module, (nn.Linear, nn.Embedding)):
        nn.init.normal_(module.weight, std=0.02)
    if isinstance(module, nn.Linear) and module.bias is not None:
        nn.init.zeros_(module.bias)
