"""Analysis-metric throughput: analysis.measuring.metrics against a straightforward per-image NumPy/SciPy version.

Input: the per-layer tokens and attention maps of a random-weight Study L ViT (`study_l`, 8 blocks, 8 heads,
8x8 grid) on 1,000 images, computed once by one forward pass; only the metric computation is timed.
Metrics: SSDC per layer (cosine similarity averaged over all images, Spearman against -Manhattan distance),
and per layer x head the mean attention distance and normalised entropy (the work of one clean evaluation pass).

- reference: what one writes first: loop over images (each image vectorised over heads and queries),
  accumulate in NumPy, `scipy.stats.spearmanr` and `scipy.special.entr` at the end.
- vitsweep:  `SSDCAccumulator` and `AttentionAccumulator` fed batches of `--batch-size` images, as
  `analysis.measuring.evaluate` feeds them.
Both get the same thread count (`--threads`, default 1: a like-for-like and stable comparison on a shared
CPU; NumPy's per-image element-wise work is single-threaded anyway). The vitsweep time is the best of
`--repeats`. The script also checks that both give the same numbers.

    .venv/bin/python bench/metrics_throughput.py
    .venv/bin/python bench/metrics_throughput.py --device cuda

Target: speed-up >= 20x on CPU.
"""

from __future__ import annotations

import argparse
import math
import time

import numpy as np
import scipy.special
import scipy.stats
import torch

from analysis.measuring import metrics
from trainables.model.vit import ViT
from trainables.config.architecture import ViTConfig


def model_outputs(num_images: int, device: torch.device) -> tuple[list[torch.Tensor], list[torch.Tensor], int]:
    """One forward of a random-weight study_l model: L x tokens (n, T, D), L x attention (n, H, T, T), grid G."""
    torch.manual_seed(0)
    config = ViTConfig.preset("study_l", pe="ape")
    model = ViT(config).to(device).eval()
    images = torch.randn(num_images, 3, config.img_size, config.img_size, device=device)
    tokens: list[list[torch.Tensor]] = [[] for _ in range(config.depth)]
    attention: list[list[torch.Tensor]] = [[] for _ in range(config.depth)]
    with torch.no_grad():
        for chunk in images.split(100):
            out = model(chunk, return_tokens=True, return_attention=True)
            for layer in range(config.depth):
                tokens[layer].append(out.tokens[layer])
                attention[layer].append(out.attention[layer])
    return [torch.cat(t) for t in tokens], [torch.cat(a) for a in attention], config.grid


def vitsweep_ssdc(tokens, grid: int, batch_size: int) -> np.ndarray:
    ssdc = []
    for layer_tokens in tokens:
        accumulator = metrics.SSDCAccumulator(grid)
        for start in range(0, len(layer_tokens), batch_size):
            accumulator.update(layer_tokens[start : start + batch_size, 1:])
        ssdc.append(accumulator.ssdc())
    return np.array(ssdc)


def vitsweep_attention(attention, grid: int, batch_size: int) -> tuple[np.ndarray, np.ndarray]:
    mad, entropy = [], []
    for layer_attention in attention:
        accumulator = metrics.AttentionAccumulator(grid)
        for start in range(0, len(layer_attention), batch_size):
            accumulator.update(layer_attention[start : start + batch_size])
        mad.append(accumulator.mean_attention_distance().cpu().numpy())  # .cpu() synchronises a GPU
        entropy.append(accumulator.entropy().cpu().numpy())
    return np.stack(mad), np.stack(entropy)


def reference_ssdc(tokens: list[np.ndarray], grid: int) -> np.ndarray:
    """Per image: normalise, x @ x.T into a float64 sum; then scipy.stats.spearmanr over i < j."""
    n_patches = grid * grid
    rows, cols = np.divmod(np.arange(n_patches), grid)
    manhattan = np.abs(rows[:, None] - rows[None]) + np.abs(cols[:, None] - cols[None])
    upper = np.triu_indices(n_patches, 1)
    ssdc = []
    for layer_tokens in tokens:
        similarity = np.zeros((n_patches, n_patches))
        for x in layer_tokens[:, 1:]:  # (N, D) per image
            x = x / np.linalg.norm(x, axis=1, keepdims=True)
            similarity += x @ x.T
        similarity /= len(layer_tokens)
        ssdc.append(scipy.stats.spearmanr(similarity[upper], -manhattan[upper]).statistic)
    return np.array(ssdc)


def reference_attention(attention: list[np.ndarray], grid: int) -> tuple[np.ndarray, np.ndarray]:
    """Per image (vectorised over heads and queries): renormalise, distance-weighted sum, scipy.special.entr."""
    n_patches = grid * grid
    rows, cols = np.divmod(np.arange(n_patches), grid)
    euclidean = np.hypot(rows[:, None] - rows[None], cols[:, None] - cols[None])
    mad, entropy = [], []
    for layer_attention in attention:
        num_images, heads = layer_attention.shape[:2]
        distance_sum, entropy_sum = np.zeros(heads), np.zeros(heads)
        for a in layer_attention:  # (H, T, T) per image
            p = a[:, 1:, 1:]
            p = p / p.sum(-1, keepdims=True)
            distance_sum += (p * euclidean).sum(-1).mean(-1)
            entropy_sum += scipy.special.entr(p).sum(-1).mean(-1)
        mad.append(distance_sum / num_images / (math.sqrt(2) * (grid - 1)))
        entropy.append(entropy_sum / num_images / math.log(n_patches))
    return np.stack(mad), np.stack(entropy)


def best_of(repeats: int, fn, *args, synchronize: bool = False) -> tuple[float, float, object]:
    """(fastest wall time, fastest process CPU time of `repeats` calls, result of the last).

    CPU time is the steadier number on a shared machine: time spent waiting for a core is not counted.
    """
    wall, cpu = [], []
    for _ in range(repeats):
        if synchronize:
            torch.cuda.synchronize()
        start, start_cpu = time.perf_counter(), time.process_time()
        result = fn(*args)
        if synchronize:
            torch.cuda.synchronize()
        wall.append(time.perf_counter() - start)
        cpu.append(time.process_time() - start_cpu)
    return min(wall), min(cpu), result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--images", type=int, default=1000)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    sync = device.type == "cuda"

    tokens, attention, grid = model_outputs(args.images, device)
    print(f"study_l outputs on {args.images} images: {len(tokens)} layers x tokens {tuple(tokens[0].shape)}, "
          f"attention {tuple(attention[0].shape)}; device {device}, {args.threads} thread(s), best of {args.repeats}")
    tokens_np = [t.cpu().numpy() for t in tokens]
    attention_np = [a.cpu().numpy() for a in attention]

    vitsweep_ssdc(tokens, grid, args.batch_size)  # warm-up (allocator, kernels)
    *fast_ssdc_t, fast_ssdc = best_of(args.repeats, vitsweep_ssdc, tokens, grid, args.batch_size, synchronize=sync)
    *fast_attn_t, (fast_mad, fast_entropy) = best_of(
        args.repeats, vitsweep_attention, attention, grid, args.batch_size, synchronize=sync
    )
    *ref_ssdc_t, ref_ssdc = best_of(args.repeats, reference_ssdc, tokens_np, grid)
    *ref_attn_t, (ref_mad, ref_entropy) = best_of(args.repeats, reference_attention, attention_np, grid)

    for clock, index in (("wall", 0), ("process CPU", 1)):
        print(f"\n{clock + ' seconds':28s}{'reference':>12s}{'vitsweep':>12s}{'speed-up':>10s}")
        ref = (ref_ssdc_t[index], ref_attn_t[index])
        fast = (fast_ssdc_t[index], fast_attn_t[index])
        for name, ref_s, fast_s in (
            (f"SSDC ({len(tokens)} layers)", ref[0], fast[0]),
            ("MAD + entropy", ref[1], fast[1]),
            ("total", sum(ref), sum(fast)),
        ):
            print(f"{name:28s}{ref_s:12.3f}{fast_s:12.3f}{ref_s / fast_s:9.1f}x")
        print(f"{'images / s':28s}{args.images / sum(ref):12.0f}{args.images / sum(fast):12.0f}")
    pairs = {"ssdc": (fast_ssdc, ref_ssdc), "mad": (fast_mad, ref_mad), "entropy": (fast_entropy, ref_entropy)}
    for name, (fast, reference) in pairs.items():
        gap = np.abs(fast - reference).max()
        print(f"max |difference| {name:8s} {gap:.2e}")
        assert gap < 1e-4, f"{name} disagrees with the reference by {gap}"


if __name__ == "__main__":
    main()
