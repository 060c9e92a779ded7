"""ViT and positional encodings: shapes, the STUDIES.md invariances, brute-force references, config errors.

Every PE-dependent test iterates the registry (`POS_EMBEDS`). CPU, tiny preset, eval mode for properties.
"""

import dataclasses
import math
import re

import pytest
import torch

from trainables.model.pos_embed import POS_EMBEDS, apply_rotation
from trainables.model.vit import ViT
from trainables.config.architecture import PRESETS, ViTConfig

ALL_PES = sorted(POS_EMBEDS)
ROTARY_PES = ["rope2d", "rope2d_mixed"]
SCALED_PES = [pe for pe in ALL_PES if pe != "none"]


def tiny(pe: str, **overrides) -> ViT:
    torch.manual_seed(0)
    return ViT(ViTConfig.preset("tiny", pe=pe, **overrides)).eval()


def images(batch: int = 2, size: int = 32) -> torch.Tensor:
    return torch.randn(batch, 3, size, size, generator=torch.Generator().manual_seed(1))


def random_perm(n: int, seed: int = 2) -> torch.Tensor:
    return torch.randperm(n, generator=torch.Generator().manual_seed(seed))


# --- shapes -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("pe", ALL_PES)
def test_forward_backward_shapes(pe):
    model = tiny(pe, drop_rate=0.1, attn_drop_rate=0.1, proj_drop_rate=0.1, drop_path_rate=0.1).train()
    cfg = model.config
    B, T = 3, 1 + cfg.num_patches
    out = model(images(B), perm=random_perm(cfg.num_patches), return_tokens=True, return_attention=True)
    assert out.logits.shape == (B, cfg.num_classes)
    assert len(out.tokens) == len(out.attention) == cfg.depth
    assert all(t.shape == (B, T, cfg.dim) for t in out.tokens)
    assert all(a.shape == (B, cfg.heads, T, T) for a in out.attention)
    out.logits.square().mean().backward()
    for name, param in model.named_parameters():
        assert param.grad is not None and torch.isfinite(param.grad).all(), name
        assert param.grad.abs().sum() > 0, name  # every parameter, PE included, gets a learning signal


@pytest.mark.parametrize("pe", ALL_PES)
def test_tokens_and_attention_only_when_asked(pe):
    out = tiny(pe)(images())
    assert out.tokens is None and out.attention is None


@pytest.mark.parametrize("pe", ALL_PES)
def test_bf16_autocast_runs(pe):
    # rope tables are float32; the rotated q/k must come back in the autocast dtype for SDPA
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = tiny(pe)(images(), return_attention=False)
    assert out.logits.shape == (2, 10) and torch.isfinite(out.logits).all()


# --- attention paths ----------------------------------------------------------------------------------


@pytest.mark.parametrize("pe", ALL_PES)
def test_fused_and_explicit_attention_agree(pe):
    model, x = tiny(pe), images()
    with torch.no_grad():
        fused = model(x, return_tokens=True)
        explicit = model(x, return_tokens=True, return_attention=True)
    torch.testing.assert_close(explicit.logits, fused.logits, atol=1e-5, rtol=0)
    for a, b in zip(explicit.tokens, fused.tokens):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=0)
    for attn in explicit.attention:
        assert (attn >= 0).all()
        torch.testing.assert_close(attn.sum(-1), torch.ones(attn.shape[:-1]))
    # explicit_attention (the packed forward on the CPU) computes the explicit path, keeps no maps.
    with torch.no_grad():
        no_maps = model(x, explicit_attention=True)
    assert no_maps.attention is None and torch.equal(no_maps.logits, explicit.logits)


def test_tokens_are_norm1_of_block_inputs():
    model, x = tiny("ape"), images()
    with torch.no_grad():
        out = model(x, return_tokens=True)
        h = torch.cat([model.cls_token.expand(2, -1, -1), model.patch_embed(x)], 1) + model.pe.table
        torch.testing.assert_close(out.tokens[0], model.blocks[0].norm1(h))
        h, _, _ = model.blocks[0](h)
        torch.testing.assert_close(out.tokens[1], model.blocks[1].norm1(h))


# --- STUDIES.md properties ----------------------------------------------------------------------------


def test_none_is_permutation_equivariant():
    model, x = tiny("none"), images()
    perm = random_perm(model.config.num_patches)
    with torch.no_grad():
        plain = model(x, return_tokens=True)
        shuffled = model(x, perm=perm, return_tokens=True)
    torch.testing.assert_close(shuffled.logits, plain.logits, atol=1e-5, rtol=0)
    for tp, t in zip(shuffled.tokens, plain.tokens):
        torch.testing.assert_close(tp[:, 0], t[:, 0], atol=1e-5, rtol=0)  # CLS
        torch.testing.assert_close(tp[:, 1:], t[:, 1 + perm], atol=1e-5, rtol=0)  # tokens_p[:, 1+i] = t[:, 1+perm[i]]


@pytest.mark.parametrize("pe", SCALED_PES)
def test_order_matters_with_a_pe(pe):
    # the converse of equivariance: a PE ties tokens to indices, so shuffling changes the output
    model, x = tiny(pe, ape_init="normal"), images()
    with torch.no_grad():
        diff = model(x).logits - model(x, perm=random_perm(model.config.num_patches)).logits
    assert diff.abs().max() > 1e-4


@pytest.mark.parametrize("pe", SCALED_PES)
def test_zero_pe_scale_equals_none_model(pe):
    model, x = tiny(pe, ape_init="normal"), images()
    none = ViT(ViTConfig.preset("tiny", pe="none")).eval()
    result = none.load_state_dict(model.state_dict(), strict=False)
    assert not result.missing_keys and set(result.unexpected_keys) <= {"pe.table", "pe.freqs"}
    with torch.no_grad():
        reference = none(x, return_tokens=True)
        scaled = model(x, pe_scale=0.0, return_tokens=True)
        full = model(x)
    torch.testing.assert_close(scaled.logits, reference.logits, atol=1e-6, rtol=0)
    for a, b in zip(scaled.tokens, reference.tokens):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=0)
    assert (full.logits - reference.logits).abs().max() > 1e-4  # the PE did matter at scale 1


@pytest.mark.parametrize("pe", ["ape", "sincos2d", "rope2d_mixed"])
def test_pe_scale_equals_scaled_pe_tensor(pe):
    # alpha multiplies the whole additive table (CLS slot included) or every rotation angle
    model, x = tiny(pe, ape_init="normal"), images()
    with torch.no_grad():
        scaled = model(x, pe_scale=0.3).logits
        tensor = model.pe.freqs if pe == "rope2d_mixed" else model.pe.table
        tensor.mul_(0.3)
        torch.testing.assert_close(model(x).logits, scaled, atol=1e-5, rtol=0)


def brute_force_rope2d(x: torch.Tensor, grid: int, base: float, scale: float) -> torch.Tensor:
    """Study P's axial RoPE, one token and one pair at a time. x: (H, T, hd)."""
    out = x.clone().double()
    hd = x.shape[-1]
    quarter = hd // 4
    for t in range(1, x.shape[1]):  # token 0 is CLS: not rotated
        row, col = divmod(t - 1, grid)
        for j in range(quarter):
            w = base ** (-j / quarter)
            for first, pos in ((0, col), (2 * quarter, row)):
                a, b = x[:, t, first + j].double(), x[:, t, first + quarter + j].double()
                phi = pos * w * scale
                out[:, t, first + j] = a * math.cos(phi) - b * math.sin(phi)
                out[:, t, first + quarter + j] = b * math.cos(phi) + a * math.sin(phi)
    return out.float()


@pytest.mark.parametrize("scale", [1.0, 0.5])
def test_rope2d_matches_brute_force(scale):
    model = tiny("rope2d", rope_base=100.0)
    cfg = model.config
    x = torch.randn(cfg.heads, 1 + cfg.num_patches, cfg.head_dim)
    for cos, sin in model.pe.rotations(scale):  # same fixed rotation in every block
        torch.testing.assert_close(apply_rotation(x, cos, sin), brute_force_rope2d(x, cfg.grid, 100.0, scale))


@pytest.mark.parametrize("scale", [1.0, 0.7])
@pytest.mark.parametrize("pe", ROTARY_PES)
def test_rope_logits_depend_only_on_coordinate_differences(pe, scale):
    model = tiny(pe)
    cfg = model.config
    G, T = cfg.grid, 1 + cfg.num_patches
    content = torch.randn(1, cfg.heads, 1, cfg.head_dim).expand(1, cfg.heads, T, cfg.head_dim)  # q = k = const
    rows, cols = torch.arange(cfg.num_patches) // G, torch.arange(cfg.num_patches) % G
    offset = (rows[:, None] - rows[None]) * (2 * G) + (cols[:, None] - cols[None])  # (N, N) id of (dr, dc)
    with torch.no_grad():
        for cos, sin in model.pe.rotations(scale):
            q = apply_rotation(content, cos, sin)  # (1, H, T, hd)
            torch.testing.assert_close(q[:, :, 0], content[:, :, 0], atol=0, rtol=0)  # CLS not rotated
            logits = (q @ q.transpose(-2, -1))[0, :, 1:, 1:]  # (H, N, N) patch to patch
            spread_within = torch.zeros(cfg.heads)
            for o in offset.unique():
                group = logits[:, offset == o]  # all pairs with the same (dr, dc)
                spread_within = torch.maximum(spread_within, group.amax(-1) - group.amin(-1))
            assert spread_within.max() < 1e-4
            assert (logits.amax((-2, -1)) - logits.amin((-2, -1))).min() > 1e-2  # yet position does matter


def test_sincos2d_matches_brute_force_loop():
    model = tiny("sincos2d")
    D, G = model.config.dim, model.config.grid
    expected = torch.zeros(1 + G * G, D, dtype=torch.float64)
    for i in range(G * G):
        y, x = divmod(i, G)  # row, column
        for k in range(D // 4):
            w = 1.0 / 10000 ** (k / (D / 4))
            expected[1 + i, k] = math.sin(x * w)
            expected[1 + i, D // 4 + k] = math.cos(x * w)
            expected[1 + i, D // 2 + k] = math.sin(y * w)
            expected[1 + i, 3 * D // 4 + k] = math.cos(y * w)
    torch.testing.assert_close(model.pe.additive()[0], expected.float(), atol=1e-6, rtol=0)


@pytest.mark.parametrize("init, std", [("normal", 1.0), ("trunc_normal", 0.02)])
def test_ape_init(init, std):
    table = ViT(ViTConfig.preset("study_l", ape_init=init)).pe.table
    assert table.shape == (1, 65, 192)
    assert abs(table.std().item() / std - 1) < 0.05


def test_study_p_follows_its_code_cls_n01_linear_default_init_no_final_norm():
    """Where the paper is silent, study_p is Study P's `model.py`: `cls_token = randn(1, 1, D)`, every
    nn.Linear at PyTorch's default (kaiming-uniform weights, uniform bias: |w| <= 1/sqrt(fan_in)), and the
    head on CLS as it leaves the last block (`final_feed_forward(out[:, 0])`); the other presets keep timm's."""
    torch.manual_seed(0)
    small = dict(img_size=32, patch_size=4, dim=96, depth=2, num_classes=10)  # study_p's choices, a small model
    p, timm = ViT(ViTConfig.preset("study_p", **small)), ViT(ViTConfig.preset("study_l", **small))
    assert abs(p.cls_token.std().item() - 1) < 0.15 and timm.cls_token.abs().max() < 1e-4
    for model, default in ((p, True), (timm, False)):
        for name, module in model.named_modules():
            if isinstance(module, torch.nn.Linear):
                bound = 1 / math.sqrt(module.in_features)
                uniform = module.weight.abs().max() <= bound and module.weight.std() > 0.45 * bound
                assert uniform == default and (module.bias.abs().sum() > 0) == default, name
    assert isinstance(p.norm, torch.nn.Identity) and isinstance(timm.norm, torch.nn.LayerNorm)
    x, p = images(2), p.eval()  # dropout off
    with torch.no_grad():
        h = p.patch_embed(x)
        h = torch.cat([p.cls_token.expand(2, -1, -1), h], 1) + p.pe.additive()
        for block in p.blocks:
            h = block(h)[0]
        torch.testing.assert_close(p(x).logits, p.head(h[:, 0]))
    assert not any(name.startswith("norm.") for name, _ in p.named_parameters())


def test_rope_mixed_init_as_heo_et_al():
    cfg = ViTConfig.preset("tiny", pe="rope2d_mixed")
    f_x, f_y = ViT(cfg).pe.freqs.detach()  # (L, H, hd/2) each
    quarter = cfg.head_dim // 4
    mag = 10.0 ** (-torch.arange(quarter) / quarter)
    # two orthogonal directions per head: (f_x, f_y)[:Q] = mag (cos phi, sin phi), [Q:] = mag (-sin phi, cos phi)
    torch.testing.assert_close(torch.hypot(f_x, f_y), torch.cat([mag, mag]).expand_as(f_x))
    torch.testing.assert_close(f_x[..., :quarter] * f_x[..., quarter:] + f_y[..., :quarter] * f_y[..., quarter:],
                               torch.zeros_like(f_x[..., :quarter]), atol=1e-6, rtol=0)
    phi = torch.atan2(f_y[..., 0], f_x[..., 0])  # (L, H): random, differs across heads and layers
    assert phi.unique().numel() == cfg.depth * cfg.heads


# --- permutations -------------------------------------------------------------------------------------


def test_per_image_perm():
    model, x = tiny("ape", ape_init="normal"), images(3)
    N = model.config.num_patches
    perms = torch.stack([random_perm(N, seed) for seed in range(3)])  # (B, N)
    with torch.no_grad():
        per_image = model(x, perm=perms, return_tokens=True)
        one_by_one = torch.cat([model(x[b : b + 1], perm=perms[b]).logits for b in range(3)])
        per_batch = model(x, perm=perms[0]).logits
    torch.testing.assert_close(per_image.logits, one_by_one, atol=1e-5, rtol=0)
    torch.testing.assert_close(per_batch[0], per_image.logits[0], atol=1e-5, rtol=0)
    assert (per_batch[1:] - per_image.logits[1:]).abs().max() > 1e-4


@pytest.mark.parametrize(
    "perm, match",
    [
        (torch.arange(63), r"shape \(63,\).*\(64,\).*\(2, 64\)"),
        (torch.arange(64).expand(3, 64), r"shape \(3, 64\).*\(64,\).*\(2, 64\)"),
        (torch.arange(64).reshape(1, 1, 64), r"shape \(1, 1, 64\).*\(64,\).*\(2, 64\)"),
        (torch.arange(64).float(), r"dtype=torch.float32.*torch.long"),
    ],
)
def test_bad_perm_raises(perm, match):
    with pytest.raises(ValueError, match=match):
        tiny("none")(images(2), perm=perm)


# --- config -------------------------------------------------------------------------------------------


def test_preset_parameter_counts():
    def count(name, **kw):
        with torch.device("meta"):  # shapes only: no memory, no init
            return sum(p.numel() for p in ViT(ViTConfig.preset(name, **kw)).parameters())

    assert 2.3e6 <= count("study_l") <= 2.5e6  # Study L's "~2.4M" (2,400,586)
    assert 2.3e6 <= count("study_l", img_size=64, patch_size=8) <= 2.5e6  # Tiny-ImageNet (2,428,234)
    # ViT-S/16 is 22.05M with a 1000-class head; a 100-class head saves 346k: 21,704,164
    assert 21.6e6 <= count("study_p") <= 21.8e6
    assert count("vit_s") == count("study_p")  # heads split D, they add no parameters


def test_preset_values_and_overrides():
    p = ViTConfig.preset("study_p")
    assert (p.dim, p.depth, p.heads, p.mlp_ratio, p.patch_size, p.img_size, p.grid) == (384, 12, 8, 4.0, 16, 224, 14)
    assert (p.drop_rate, p.attn_drop_rate, p.proj_drop_rate, p.drop_path_rate) == (0.15, 0.15, 0.15, 0.2)
    assert (p.ape_init, p.num_classes) == ("normal", 100)
    assert (p.cls_init, p.linear_init, p.final_norm) == ("normal", "torch", False)  # Study P's code
    assert ViTConfig.preset("study_l").final_norm and ViTConfig.preset("study_l").cls_init == "timm"
    assert ViTConfig.preset("vit_s") == dataclasses.replace(p, heads=6)
    tin = ViTConfig.preset("study_l", img_size=64, patch_size=8, num_classes=200, pe="rope2d")
    assert (tin.grid, tin.num_patches, tin.num_classes, tin.pe, tin.dim) == (8, 64, 200, "rope2d", 192)


@pytest.mark.parametrize("preset", sorted(PRESETS))
@pytest.mark.parametrize("pe", ALL_PES)
def test_flat_round_trip(preset, pe):
    cfg = ViTConfig.preset(preset, pe=pe)
    flat = cfg.to_flat()
    assert all(isinstance(v, (int, float, str)) for v in flat.values())
    assert ViTConfig.from_flat(flat) == cfg
    assert ViTConfig.from_flat({**flat, "lr": 1e-3, "dataset": "cifar10"}) == cfg  # run fields ignored
    assert ViTConfig.from_flat({k: str(v) for k, v in flat.items()}) == cfg  # as MLflow params come back


def test_config_is_frozen_and_replace_revalidates():
    cfg = ViTConfig.preset("tiny")
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.dim = 32
    with pytest.raises(ValueError, match="heads=5"):
        dataclasses.replace(cfg, heads=5)


def _choices(names) -> str:
    return re.escape(str(sorted(names)))


@pytest.mark.parametrize(
    "build, match",
    [
        (lambda: ViTConfig(img_size=30, patch_size=4), r"img_size=30.*patch_size=4.*\[1, 2, 3, 5, 6, 10, 15, 30\]"),
        (lambda: ViTConfig(dim=190, heads=8), r"dim=190.*heads=8.*\[1, 2, 5, 10, 19, 38, 95, 190\]"),
        (lambda: ViTConfig(dim=66, heads=6, pe="sincos2d"), r"sincos2d.*dim=66.*64, 68"),
        (lambda: ViTConfig(dim=72, heads=12, pe="rope2d"), r"rope2d.*head_dim=6.*\[1, 2, 3, 6, 9, 18\]"),
        (lambda: ViTConfig(dim=72, heads=12, pe="rope2d_mixed"), r"rope2d_mixed.*head_dim=6.*\[1, 2, 3, 6, 9, 18\]"),
        (lambda: ViTConfig(pe="learned"), r"pe must be one of .*got 'learned'"),
        (lambda: ViTConfig(ape_init="xavier"), r"ape_init must be one of .*got 'xavier'"),
        (lambda: ViTConfig(drop_path_rate=1.0), r"drop_path_rate must be a finite number >= 0 and < 1, got 1.0"),
        (lambda: ViTConfig.preset("vit_b"), r"preset='vit_b'.*" + _choices(PRESETS)),
        (lambda: ViTConfig.preset("tiny", dims=32), r"\['dims'\].*'img_size'.*'rope_base'"),
    ],
)
def test_bad_config_raises(build, match):
    with pytest.raises(ValueError, match=match):
        build()


def test_no_weight_decay_names_exist():
    for pe, expected in [("none", {"cls_token"}), ("ape", {"cls_token", "pe.table"}),
                         ("rope2d_mixed", {"cls_token", "pe.freqs"})]:
        model = tiny(pe)
        assert model.no_weight_decay() == expected
        assert expected <= dict(model.named_parameters()).keys()
