"""analysis.measuring.metrics against brute-force NumPy/SciPy references and the STUDIES.md properties."""

from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.stats
import torch

from analysis.measuring import metrics

GRID = 4
N = GRID * GRID


# One pass of the accumulators over one batch, and the CLS mass read off the maps directly: what the
# tests compare the batched accumulators (and tests/test_evaluate.py the measured rows) against.
def ssdc(tokens: torch.Tensor, grid: int, *, coords: torch.Tensor | None = None, distance: str = "manhattan") -> float:
    accumulator = metrics.SSDCAccumulator(grid, coords=coords, distance=distance)
    accumulator.update(tokens)
    return accumulator.ssdc()


def mean_attention_distance(attn: torch.Tensor, grid: int, *, has_cls: bool = True, normalize: bool = True,
                            renormalize: bool = True) -> torch.Tensor:
    accumulator = metrics.AttentionAccumulator(grid, has_cls=has_cls)
    accumulator.update(attn)
    return accumulator.mean_attention_distance(normalize=normalize, renormalize=renormalize)


def attention_entropy(attn: torch.Tensor, grid: int, *, has_cls: bool = True) -> torch.Tensor:
    accumulator = metrics.AttentionAccumulator(grid, has_cls=has_cls)
    accumulator.update(attn)
    return accumulator.entropy()


def cls_attention_mass(attn: torch.Tensor) -> torch.Tensor:
    """attn (B, H, 1 + N, 1 + N), CLS first: attn[b, h, q, 0] averaged over images and patch queries."""
    if attn.dim() != 4:
        raise ValueError(f"attn must be (B, H, T, T); got {tuple(attn.shape)}")
    return attn[:, :, 1:, 0].to(torch.float64).mean((0, 2))


def _softmax_attention(batch: int, heads: int, tokens: int, *, seed: int, temperature: float = 1.0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    logits = torch.randn(batch, heads, tokens, tokens, generator=generator, dtype=torch.float64)
    return (logits / temperature).softmax(-1)


def _ssdc_reference(tokens: np.ndarray, grid: int, distance: str = "manhattan") -> float:
    """Per-image loops over token pairs, then scipy.stats.spearmanr: the definition read literally."""
    batch, n, _ = tokens.shape
    similarity = np.zeros((n, n))
    for b in range(batch):
        for i in range(n):
            for j in range(n):
                u, v = tokens[b, i], tokens[b, j]
                similarity[i, j] += u @ v / (np.linalg.norm(u) * np.linalg.norm(v))
    similarity /= batch
    s, d = [], []
    for i in range(n):
        for j in range(i + 1, n):
            (ri, ci), (rj, cj) = divmod(i, grid), divmod(j, grid)
            if distance == "manhattan":
                d.append(abs(ri - rj) + abs(ci - cj))
            else:
                d.append(math.hypot(ri - rj, ci - cj))
            s.append(similarity[i, j])
    return scipy.stats.spearmanr(s, -np.asarray(d)).statistic


def _attention_reference(attn: np.ndarray, grid: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Loop over images, heads and queries: MAD (raw, patches), entropy / log N, CLS mass."""
    batch, heads, t, _ = attn.shape
    n = t - 1
    mad, entropy, cls = np.zeros(heads), np.zeros(heads), np.zeros(heads)
    for b in range(batch):
        for h in range(heads):
            for q in range(n):
                row = attn[b, h, 1 + q, 1:]
                cls[h] += attn[b, h, 1 + q, 0]
                p = row / row.sum()
                rq, cq = divmod(q, grid)
                for k in range(n):
                    rk, ck = divmod(k, grid)
                    mad[h] += p[k] * math.hypot(rq - rk, cq - ck)
                    if p[k] > 0:
                        entropy[h] -= p[k] * math.log(p[k])
    count = batch * n
    return mad / count, entropy / count / math.log(n), cls / count


def _sincos2d_table(grid: int, dim: int) -> torch.Tensor:
    """STUDIES.md: channels [sin(x w), cos(x w), sin(y w), cos(y w)], w_k = 1/10000^(k/(D/4)), x = column."""
    quarter = dim // 4
    omega = 1.0 / 10000 ** (torch.arange(quarter, dtype=torch.float64) / quarter)
    index = torch.arange(grid * grid)
    y, x = (index // grid).double()[:, None] * omega, (index % grid).double()[:, None] * omega
    return torch.cat([x.sin(), x.cos(), y.sin(), y.cos()], dim=1)  # (N, D)


# --------------------------------------------------------------------------- ranks and SSDC


@pytest.mark.parametrize("seed", range(3))
def test_average_ranks_match_scipy_rankdata_with_ties(seed):
    values = torch.randint(0, 7, (200,), generator=torch.Generator().manual_seed(seed)).double()
    expected = scipy.stats.rankdata(values.numpy(), method="average")
    np.testing.assert_array_equal(metrics.average_ranks(values).numpy(), expected)


def test_spearman_matches_scipy_when_both_sides_tie():
    generator = torch.Generator().manual_seed(0)
    x = torch.randint(0, 5, (300,), generator=generator).double()
    y = x + torch.randint(0, 3, (300,), generator=generator).double()
    assert metrics.spearman(x, y) == pytest.approx(scipy.stats.spearmanr(x, y).statistic, abs=1e-12)


@pytest.mark.parametrize("distance", metrics.DISTANCES)
@pytest.mark.parametrize("seed", range(2))
def test_ssdc_matches_bruteforce_reference(distance, seed):
    # A smooth field plus noise, so SSDC is far from 0 and the ranking is non-trivial.
    generator = torch.Generator().manual_seed(seed)
    tokens = _sincos2d_table(GRID, 16)[None] + 0.5 * torch.randn(3, N, 16, generator=generator, dtype=torch.float64)
    expected = _ssdc_reference(tokens.numpy(), GRID, distance)
    assert ssdc(tokens, GRID, distance=distance) == pytest.approx(expected, abs=1e-6)


def test_ssdc_coords_override_equals_permuted_grid():
    """Scoring tokens against shuffled coordinates = scoring the tokens moved to those positions."""
    tokens = torch.randn(2, N, 8, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    perm = torch.randperm(N, generator=torch.Generator().manual_seed(2))
    coords = metrics.grid_coords(GRID)[perm]  # token i sits at the position of patch perm[i]
    moved = metrics.unpermute_tokens(tokens, perm)
    assert ssdc(tokens, GRID, coords=coords) == pytest.approx(ssdc(moved, GRID), abs=1e-12)


def test_ssdc_of_sincos2d_table_is_about_096_and_of_noise_near_0():
    from trainables.model.pos_embed import sincos2d_table

    table = _sincos2d_table(8, 192)
    torch.testing.assert_close(sincos2d_table(8, 192)[0, 1:], table.float())  # the model's table, CLS slot dropped
    assert ssdc(table[None], 8) == pytest.approx(0.96, abs=0.01)
    assert ssdc(sincos2d_table(8, 192)[:, 1:], 8) == pytest.approx(0.96, abs=0.01)
    noise = torch.randn(32, 64, 192, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    assert abs(ssdc(noise, 8)) < 0.05


def test_unknown_distance_raises_listing_choices():
    with pytest.raises(ValueError, match="manhattan"):
        ssdc(torch.randn(1, N, 4), GRID, distance="chebyshev")


def test_accumulator_over_batches_equals_ssdc_of_concatenation():
    generator = torch.Generator().manual_seed(3)
    field = _sincos2d_table(GRID, 8)
    batches = [torch.randn(b, N, 8, generator=generator, dtype=torch.float64) + field for b in (1, 4, 2)]
    accumulator = metrics.SSDCAccumulator(GRID)
    for batch in batches:
        accumulator.update(batch)
    assert accumulator.count == 7
    assert accumulator.ssdc() == pytest.approx(ssdc(torch.cat(batches), GRID), abs=1e-12)


@pytest.mark.parametrize("per_image", [False, True])
def test_unpermuting_with_per_batch_perms_recovers_unpermuted_ssdc(per_image):
    generator = torch.Generator().manual_seed(4)
    field = _sincos2d_table(GRID, 8)
    clean = [torch.randn(3, N, 8, generator=generator, dtype=torch.float64) + field for _ in range(3)]
    content, index = metrics.SSDCAccumulator(GRID), metrics.SSDCAccumulator(GRID)
    for batch in clean:
        if per_image:
            perm = torch.stack([torch.randperm(N, generator=generator) for _ in range(batch.shape[0])])
            permuted = torch.stack([batch[b, perm[b]] for b in range(batch.shape[0])])
        else:
            perm = torch.randperm(N, generator=generator)
            permuted = batch[:, perm]  # token i carries patch perm[i], as the model's `perm`
        content.update(permuted, perm=perm)
        index.update(permuted)
    expected = ssdc(torch.cat(clean), GRID)
    assert content.ssdc() == pytest.approx(expected, abs=1e-12)
    assert abs(index.ssdc()) < abs(expected)  # shuffled indices lose the structure


def test_unpermute_rejects_wrong_perm_shape():
    with pytest.raises(ValueError, match="perm"):
        metrics.unpermute_tokens(torch.randn(2, N, 4), torch.zeros(3, N, dtype=torch.long))


def test_delta_ssdc_is_layer1_minus_layer0():
    assert metrics.delta_ssdc([0.2, 0.7, 0.1]) == pytest.approx(0.5)
    with pytest.raises(ValueError):
        metrics.delta_ssdc([0.2])


# --------------------------------------------------------------------------- attention statistics


@pytest.mark.parametrize("temperature", [1.0, 0.1])
def test_attention_metrics_match_bruteforce_reference(temperature):
    attn = _softmax_attention(2, 3, 1 + N, seed=5, temperature=temperature)
    mad, entropy, cls = _attention_reference(attn.numpy(), GRID)
    np.testing.assert_allclose(mean_attention_distance(attn, GRID, normalize=False).numpy(), mad, atol=1e-9)
    np.testing.assert_allclose(
        mean_attention_distance(attn, GRID).numpy(), mad / (math.sqrt(2) * (GRID - 1)), atol=1e-9
    )
    np.testing.assert_allclose(attention_entropy(attn, GRID).numpy(), entropy, atol=1e-9)
    np.testing.assert_allclose(cls_attention_mass(attn).numpy(), cls, atol=1e-9)


def test_identity_attention_has_mad_0_and_entropy_0():
    attn = torch.eye(1 + N, dtype=torch.float64).expand(2, 3, 1 + N, 1 + N)
    assert torch.all(mean_attention_distance(attn, GRID) == 0)
    assert torch.all(attention_entropy(attn, GRID) == 0)
    assert torch.all(cls_attention_mass(attn) == 0)


def test_uniform_attention_has_entropy_1_and_known_mad():
    attn = torch.full((1, 2, 1 + N, 1 + N), 1.0 / (1 + N), dtype=torch.float64)
    torch.testing.assert_close(attention_entropy(attn, GRID), torch.ones(2, dtype=torch.float64))
    torch.testing.assert_close(cls_attention_mass(attn), torch.full((2,), 1.0 / (1 + N), dtype=torch.float64))
    distance = metrics.pairwise_distance(metrics.grid_coords(GRID), "euclidean")
    mean_distance = distance.mean().expand(2)
    torch.testing.assert_close(mean_attention_distance(attn, GRID, normalize=False), mean_distance)


def test_group_ssdc_is_the_unweighted_mean_of_each_groups_ssdc():
    tokens = torch.randn(8, N, 6, generator=torch.Generator().manual_seed(3))
    groups = [0, 0, 0, 1, 1, 0, 2, 2]  # in any order, across updates
    grouped = metrics.GroupSSDC(GRID)
    grouped.update(tokens[:4], groups[:4])
    grouped.update(tokens[4:], groups[4:])
    expected = [ssdc(tokens[[b for b, g in enumerate(groups) if g == k]], GRID) for k in (0, 1, 2)]
    assert grouped.ssdc() == pytest.approx(sum(expected) / 3, abs=1e-12)
    with pytest.raises(ValueError, match="no tokens"):
        metrics.GroupSSDC(GRID).ssdc()


@pytest.mark.parametrize("grid, renormalised", [(8, 0.418), (14, 0.396)])
def test_a_cls_sink_head_is_uniform_renormalised_and_near_0_not_renormalised(grid, renormalised):
    """A head whose patch queries give CLS 0.9 and spread the rest uniformly over the patches: with
    the rows renormalised after dropping CLS (``mad``) it is uniform attention; without (``mad_no_renorm``,
    the widely copied convention) one tenth of that; its ``cls_mass`` says which kind of head it is."""
    patches = grid * grid
    attn = torch.zeros(1, 2, 1 + patches, 1 + patches, dtype=torch.float64)
    attn[:, :, :, 0] = 0.9
    attn[:, :, :, 1:] = 0.1 / patches
    attn[:, 1] = torch.eye(1 + patches)  # a second head, attending to itself only: MAD 0 either way
    accumulator = metrics.AttentionAccumulator(grid)
    accumulator.update(attn)
    mad, no_renorm = accumulator.mean_attention_distance(), accumulator.mean_attention_distance(renormalize=False)
    assert mad.tolist() == pytest.approx([renormalised, 0.0], abs=5e-4)
    assert no_renorm.tolist() == pytest.approx([renormalised / 10, 0.0], abs=5e-5)
    assert accumulator.cls_mass().tolist() == pytest.approx([0.9, 0.0])
    raw = mean_attention_distance(attn, grid, normalize=False, renormalize=False)
    torch.testing.assert_close(raw, no_renorm * metrics.max_grid_distance(grid))


def test_all_mass_on_farthest_patch_gives_normalised_mad_1():
    # Query q attends only to the point-mirrored patch N-1-q: corner queries reach the maximum sqrt(2)(G-1).
    grid = 2
    attn = torch.zeros(1, 1, 5, 5, dtype=torch.float64)
    attn[0, 0, 0, 0] = 1.0
    for q in range(4):
        attn[0, 0, 1 + q, 1 + (3 - q)] = 1.0
    assert mean_attention_distance(attn, grid).item() == pytest.approx(1.0)


def test_attention_without_cls():
    attn = _softmax_attention(2, 2, N, seed=6)
    with_cls = torch.zeros(2, 2, 1 + N, 1 + N, dtype=torch.float64)
    with_cls[:, :, 1:, 1:] = attn
    with_cls[:, :, 0, 0] = 1.0
    torch.testing.assert_close(
        attention_entropy(attn, GRID, has_cls=False), attention_entropy(with_cls, GRID)
    )
    accumulator = metrics.AttentionAccumulator(GRID, has_cls=False)
    accumulator.update(attn)
    with pytest.raises(ValueError, match="CLS"):
        accumulator.cls_mass()


def test_attention_accumulator_over_batches_equals_one_shot():
    batches = [_softmax_attention(b, 2, 1 + N, seed=7 + b) for b in (1, 3)]
    whole = torch.cat(batches)
    accumulator = metrics.AttentionAccumulator(GRID)
    for batch in batches:
        accumulator.update(batch)
    torch.testing.assert_close(accumulator.mean_attention_distance(), mean_attention_distance(whole, GRID))
    torch.testing.assert_close(accumulator.entropy(), attention_entropy(whole, GRID))
    torch.testing.assert_close(accumulator.cls_mass(), cls_attention_mass(whole))


def test_attention_grid_mismatch_raises():
    with pytest.raises(ValueError, match="grid"):
        mean_attention_distance(_softmax_attention(1, 1, 1 + N, seed=0), GRID + 1)


# --------------------------------------------------------------------------- fragility


def test_fragility():
    assert metrics.fragility(0.6, 0.6) == 0.0
    assert metrics.fragility(0.8, 0.2) == pytest.approx(0.75)
    assert math.isnan(metrics.fragility(0.0, 0.0))
    assert math.isnan(metrics.fragility(math.nan, 0.5))
    with pytest.raises(ValueError, match="acc_clean"):
        metrics.fragility(64.0, 32.0)


def test_query_with_all_mass_on_cls_adds_zero_distance_and_entropy():
    attn = torch.zeros(1, 1, 1 + N, 1 + N, dtype=torch.float64)
    attn[0, 0, :, 0] = 1.0  # every query (CLS included) attends only to CLS: no patch mass to renormalise
    attn[0, 0, 1, :] = 0.0
    attn[0, 0, 1, 1:] = 1.0 / N  # ... except patch query 0, which attends uniformly to the patches
    assert attention_entropy(attn, GRID).item() == pytest.approx(1.0 / N)
    assert torch.isfinite(mean_attention_distance(attn, GRID)).all()
    assert cls_attention_mass(attn).item() == pytest.approx((N - 1) / N)


def test_paired_counts_by_hand():
    clean = torch.tensor([1, 1, 1, 0, 0, 1], dtype=torch.bool)
    shift = torch.tensor([1, 0, 0, 1, 0, 1], dtype=torch.bool)
    assert metrics.paired_counts(clean, shift) == (2, 2, 1)
    # FS from the cells: (right_clean_only - right_shift_only) / clean-right = (2 - 1) / 4
    assert metrics.fragility(4 / 6, 3 / 6) == pytest.approx((2 - 1) / 4)
    with pytest.raises(ValueError, match="same images"):
        metrics.paired_counts(clean, shift[:5])
