"""The ViT both studies train: `ViTConfig` (frozen, flat), `ViT`, `ViTOutput`.

A plain pre-norm ViT with a CLS-token classifier (Dosovitskiy et al. 2021), built from timm layers
(PatchEmbed, Mlp, DropPath, trunc_normal_) and timm's init, with the positional encoding chosen by name
from `trainables.model.pos_embed.POS_EMBEDS`. Positions are explicit in `forward`: `perm` shuffles patch tokens
(RPT / RPI) right after patch embedding and `pe_scale` scales the PE (Study P's alpha), so every PE
runs the same code path. Analysis asks for per-layer tokens and attention maps instead of hooking.

Shapes: B batch, C classes, G = img_size / patch_size grid side, N = G*G patches, T = 1 + N tokens (CLS
first), D = dim, H = heads, hd = D / H, L = depth.

`ViTConfig` and the presets (`ViTConfig.preset(name, **overrides)`, with their table of sizes and
parameter counts) are the torch-free `trainables/config/architecture.py`, re-exported here.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from timm.layers import DropPath, Mlp, PatchEmbed, trunc_normal_
from torch import nn

from trainables.model.pos_embed import Rotation, apply_rotation, build_pos_embed
from trainables.config.architecture import ViTConfig


@dataclass
class ViTOutput:
    """logits (B, C); tokens: L x (B, T, D) = norm1(h_l), CLS first; attention: L x (B, H, T, T) softmax maps."""

    logits: torch.Tensor
    tokens: list[torch.Tensor] | None = None
    attention: list[torch.Tensor] | None = None


def split_heads(qkv: torch.Tensor, heads: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """qkv (B, T, 3D) -> q, k, v (B, H, T, hd), views. Split on the (B, T, 3, H, hd) layout, then
    move heads: the backward stacks dq, dk, dv straight into the layout the qkv matmul's gradient
    reads (unbinding after a head-major permute would stack them head-major, then copy them once
    more to undo the permute: 1.2 MB per image per step for `study_l`)."""
    B, T, D3 = qkv.shape
    return tuple(t.transpose(1, 2) for t in qkv.reshape(B, T, 3, heads, D3 // (3 * heads)).unbind(2))


class Attention(nn.Module):
    """Multi-head self-attention; fused SDPA by default, explicit softmax only when the map is wanted."""

    def __init__(self, dim: int, heads: int, attn_drop: float, proj_drop: float):
        super().__init__()
        self.heads, self.head_dim = heads, dim // heads
        self.scale = self.head_dim**-0.5
        self.qkv = nn.Linear(dim, 3 * dim)  # with bias, as timm ViT (qkv_bias=True)
        self.attn_drop = nn.Dropout(attn_drop)
        self.proj = nn.Linear(dim, dim)
        self.proj_drop = nn.Dropout(proj_drop)

    def forward(
        self, x: torch.Tensor, rotation: Rotation | None = None, return_attention: bool = False,
        explicit: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """x (B, T, D) -> (out (B, T, D), softmax map (B, H, T, T) or None). The explicit softmax
        runs when the map is wanted or `explicit` is set (under vmap on a device whose fused
        kernel has no batching rule: `packed.fused_attention_under_vmap`)."""
        B, T, D = x.shape
        q, k, v = split_heads(self.qkv(x), self.heads)
        if rotation is not None:  # (B, H, T, hd) each
            q, k = apply_rotation(q, *rotation), apply_rotation(k, *rotation)
        if return_attention or explicit:
            attn = ((q * self.scale) @ k.transpose(-2, -1)).softmax(dim=-1)  # (B, H, T, T)
            out = self.attn_drop(attn) @ v
            attn = attn if return_attention else None
        else:
            attn = None
            out = F.scaled_dot_product_attention(q, k, v, dropout_p=self.attn_drop.p if self.training else 0.0)
        out = out.transpose(1, 2).reshape(B, T, D)
        return self.proj_drop(self.proj(out)), attn


class Block(nn.Module):
    """Pre-norm transformer block: h + DropPath(Attn(norm1 h)), then + DropPath(MLP(norm2 h))."""

    def __init__(self, config: ViTConfig, drop_path: float):
        super().__init__()
        dim = config.dim
        self.norm1 = nn.LayerNorm(dim, eps=1e-6)  # eps as timm ViT
        self.attn = Attention(dim, config.heads, config.attn_drop_rate, config.proj_drop_rate)
        self.norm2 = nn.LayerNorm(dim, eps=1e-6)
        self.mlp = Mlp(dim, int(dim * config.mlp_ratio), act_layer=nn.GELU, drop=config.proj_drop_rate)
        self.drop_path = DropPath(drop_path) if drop_path > 0 else nn.Identity()

    def forward(
        self, h: torch.Tensor, rotation: Rotation | None = None, return_attention: bool = False,
        explicit_attention: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """h (B, T, D) -> (next h (B, T, D), norm1(h) (B, T, D), attention (B, H, T, T) or None)."""
        tokens = self.norm1(h)
        out, attn = self.attn(tokens, rotation, return_attention, explicit_attention)
        h = h + self.drop_path(out)
        h = h + self.drop_path(self.mlp(self.norm2(h)))
        return h, tokens, attn


def permute_patches(patches: torch.Tensor, perm: torch.Tensor) -> torch.Tensor:
    """patches (B, N, D), perm (N,) or (B, N) integer -> out (B, N, D) with out[b, i] = patches[b, perm[b, i]]."""
    B, N, D = patches.shape
    if perm.dtype.is_floating_point or perm.dtype.is_complex or perm.dtype == torch.bool:
        raise ValueError(f"perm has dtype={perm.dtype}; valid: an integer dtype (torch.long)")
    if perm.shape not in ((N,), (B, N)):
        raise ValueError(f"perm has shape {tuple(perm.shape)}; valid: (N,) = ({N},) for one permutation of the "
                         f"batch or (B, N) = ({B}, {N}) for one per image")
    perm = perm.to(patches.device)
    if perm.ndim == 1:
        return patches[:, perm]
    return patches.gather(1, perm[:, :, None].expand(B, N, D))


class ViT(nn.Module):
    """Pre-norm ViT, CLS-token classifier, positional encoding by name (config.pe)."""

    def __init__(self, config: ViTConfig):
        super().__init__()
        self.config = config
        D = config.dim
        self.patch_embed = PatchEmbed(config.img_size, config.patch_size, config.in_chans, D)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, D))
        self.pe = build_pos_embed(config)
        self.pos_drop = nn.Dropout(config.drop_rate)
        # stochastic depth rises linearly from 0 to drop_path_rate over the blocks (timm's schedule)
        drop_paths = [config.drop_path_rate * i / max(config.depth - 1, 1) for i in range(config.depth)]
        self.blocks = nn.ModuleList(Block(config, p) for p in drop_paths)
        self.norm = nn.LayerNorm(D, eps=1e-6) if config.final_norm else nn.Identity()
        self.head = nn.Linear(D, config.num_classes)
        self._init_weights()

    def _init_weights(self) -> None:
        """timm ViT's init (CLS N(0, 1e-6), Linear trunc_normal(0.02) and zero bias) or Study P's code
        (CLS N(0, 1), Linear left at PyTorch's default), per `cls_init` and `linear_init`; conv as is."""
        nn.init.normal_(self.cls_token, std=1.0 if self.config.cls_init == "normal" else 1e-6)
        if self.config.linear_init == "timm":
            for module in self.modules():
                if isinstance(module, nn.Linear):
                    trunc_normal_(module.weight, std=0.02)
                    nn.init.zeros_(module.bias)

    def no_weight_decay(self) -> set[str]:
        """Parameter names an optimiser should not decay (timm / Heo et al. convention)."""
        return {name for name, _ in self.named_parameters() if name in ("cls_token", "pe.table", "pe.freqs")}

    def forward(
        self,
        images: torch.Tensor,
        *,
        perm: torch.Tensor | None = None,
        pe_scale: float = 1.0,
        return_tokens: bool = False,
        return_attention: bool = False,
        explicit_attention: bool = False,
    ) -> ViTOutput:
        """images (B, 3, H, W) normalised -> ViTOutput.

        perm: (N,) or (B, N); patches[b, i] <- patches[b, perm[b, i]] after patch embedding, before the PE,
            so the PE stays tied to indices (RPT in training, RPI at inference).
        pe_scale: multiplies the additive table (CLS slot included) or the rotation angles (rope).
        explicit_attention: the explicit softmax attention instead of fused SDPA, maps not kept
            (the packed forward on the CPU: `packed.fused_attention_under_vmap`).
        """
        x = self.patch_embed(images)  # (B, N, D)
        if perm is not None:
            x = permute_patches(x, perm)
        x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1)  # (B, T, D)
        table = self.pe.additive(pe_scale)
        if table is not None:
            x = x + table
        x = self.pos_drop(x)
        rotations = self.pe.rotations(pe_scale)
        tokens, attention = [], []
        for layer, block in enumerate(self.blocks):
            x, normed, attn = block(x, rotations[layer] if rotations else None, return_attention, explicit_attention)
            if return_tokens:
                tokens.append(normed)
            attention.append(attn)
        # LayerNorm is per token, so normalising CLS alone equals timm's norm-all-then-pool (Identity
        # without final_norm, as Study P's `final_feed_forward(out[:, 0])`).
        logits = self.head(self.norm(x[:, 0]))  # (B, C)
        return ViTOutput(logits, tokens if return_tokens else None, attention if return_attention else None)
