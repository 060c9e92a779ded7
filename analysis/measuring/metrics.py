"""Spatial-structure metrics of a ViT's tokens and attention maps (STUDIES.md).

Pure functions and small accumulators: tensors in, numbers out, no I/O, on the tensors' device.
Dimension alphabet: B images, N = G*G patch tokens (row-major grid: token ``i`` sits at
``(i // G, i % G)``), D channels, H heads, T = 1 + N tokens with CLS.

- SSDC (Study P): Spearman rank correlation between the cosine similarity of patch tokens, averaged
  over all evaluation images, and minus their grid distance, over pairs ``i < j``, ties given their
  average rank exactly as ``scipy.stats.spearmanr`` does (Manhattan distances on an 8x8 grid take only
  14 values over 2,016 pairs, so the tie rule matters).
- Mean attention distance, normalised attention entropy (Study L) and the CLS mass, per head.
- Fragility score FS and dSSDC (Study P).

The ``*Accumulator`` classes sum over batches so a metric covers the whole evaluation set without
holding every token or attention map.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F

from analysis.measuring.uniform_attention import max_grid_distance

DISTANCES = ("manhattan", "euclidean")


# --------------------------------------------------------------------------- grid geometry
def grid_coords(grid: int, device: torch.device | str | None = None) -> torch.Tensor:
    """Row-major ``(row, col)`` coordinates of a ``grid x grid`` patch grid: (N, 2) float64."""
    index = torch.arange(grid * grid, device=device)
    return torch.stack([index // grid, index % grid], dim=1).to(torch.float64)


def pairwise_distance(coords: torch.Tensor, distance: str = "manhattan") -> torch.Tensor:
    """Distance matrix (N, N) float64 between token positions coords (N, 2): ``manhattan``
    ``|r_i - r_j| + |c_i - c_j|`` (STUDIES.md SSDC) or ``euclidean`` the straight line."""
    if distance not in DISTANCES:
        raise ValueError(f"unknown distance {distance!r}; choose one of {DISTANCES}")
    diff = coords.to(torch.float64)[:, None, :] - coords.to(torch.float64)[None, :, :]  # (N, N, 2)
    if distance == "manhattan":
        return diff.abs().sum(-1)
    # Explicit sqrt of summed squares (not cdist) so equal integer offsets give
    # bit-identical distances: the tie structure of the ranks depends on it.
    return diff.square().sum(-1).sqrt()


# --------------------------------------------------------------------------- Spearman with average ties
def average_ranks(values: torch.Tensor) -> torch.Tensor:
    """Ranks 1..n of a 1-D tensor (n,), tied values sharing their average rank, as
    ``scipy.stats.rankdata(values, method="average")``. Returns (n,) float64."""
    sorted_values, order = torch.sort(values, stable=True)
    _, group, counts = torch.unique_consecutive(sorted_values, return_inverse=True, return_counts=True)
    # A group of `c` ties ending at 1-based rank `e` spans ranks e-c+1 .. e: average e - (c-1)/2.
    ends = counts.cumsum(0).to(torch.float64)
    group_rank = ends - (counts.to(torch.float64) - 1.0) / 2.0
    ranks = torch.empty(values.numel(), dtype=torch.float64, device=values.device)
    ranks[order] = group_rank[group]
    return ranks


def _pearson(x: torch.Tensor, y: torch.Tensor) -> float:
    """Pearson correlation of two (n,) float64 vectors; NaN when either is constant (as scipy)."""
    x, y = x - x.mean(), y - y.mean()
    denominator = torch.sqrt((x * x).sum() * (y * y).sum())
    if denominator == 0:
        return math.nan
    return float((x * y).sum() / denominator)


def spearman(x: torch.Tensor, y: torch.Tensor) -> float:
    """Spearman rank correlation of two (n,) vectors, ties given average ranks (= ``scipy.stats.spearmanr``)."""
    return _pearson(average_ranks(x), average_ranks(y))


# --------------------------------------------------------------------------- SSDC
def _cosine_similarity_sum(tokens: torch.Tensor) -> torch.Tensor:
    """Sum over images of the patch tokens' (B, N, D) cosine-similarity matrices: (N, N) in at least
    float32 (float64 stays float64)."""
    x = tokens.to(torch.promote_types(tokens.dtype, torch.float32))
    x = F.normalize(x, dim=-1)
    # One batched matmul, then the sum: ~2x faster on CPU than einsum("bnd,bmd->nm"), which first
    # copies the tokens into an (N, B*D) layout.
    return torch.bmm(x, x.transpose(1, 2)).sum(0)


def unpermute_tokens(tokens: torch.Tensor, perm: torch.Tensor) -> torch.Tensor:
    """Put permuted patch tokens back at their patches' grid positions. tokens: (B, N, D), where token
    ``i`` of image ``b`` carries patch ``perm[b, i]`` (the model's ``patches[b, i] <- patches[b, perm[b, i]]``).
    perm: (N,) shared by the batch, or (B, N). Returns (B, N, D) with ``out[b, perm[b, i]] = tokens[b, i]``."""
    batch, num_tokens, dim = tokens.shape
    perm = perm.to(tokens.device, torch.long)
    if perm.dim() == 1:
        perm = perm.expand(batch, num_tokens)
    if perm.shape != (batch, num_tokens):
        raise ValueError(f"perm has shape {tuple(perm.shape)}; expected ({num_tokens},) or ({batch}, {num_tokens})")
    out = torch.empty_like(tokens)
    out.scatter_(1, perm[:, :, None].expand(batch, num_tokens, dim), tokens)
    return out


class SSDCAccumulator:
    """SSDC over a whole evaluation set, fed one batch at a time: Spearman({S_ij}, {-D_ij}) over pairs i < j, S the
    cosine-similarity matrix of the patch tokens averaged over every image (Study P's code accumulates it over its last
    batch only, another estimator), D the grid distance of the tokens' positions. One accumulator per (condition, layer,
    coordinate frame): ``update`` with ``perm`` scores content coordinates, without it index coordinates. grid: side G
    of the patch grid (N = G*G), used for row-major coordinates unless ``coords`` (N, 2) overrides them. distance: one
    of ``DISTANCES``."""

    def __init__(self, grid: int, *, coords: torch.Tensor | None = None, distance: str = "manhattan"):
        if distance not in DISTANCES:
            raise ValueError(f"unknown distance {distance!r}; choose one of {DISTANCES}")
        self.grid = grid
        self.coords = grid_coords(grid) if coords is None else coords.detach().to("cpu", torch.float64)
        if self.coords.dim() != 2 or self.coords.shape[1] != 2:
            raise ValueError(f"coords must have shape (N, 2); got {tuple(self.coords.shape)}")
        self.distance = distance
        self.similarity_sum: torch.Tensor | None = None  # (N, N) float64
        self.count = 0

    @property
    def num_patches(self) -> int:
        return self.coords.shape[0]

    def update(self, tokens: torch.Tensor, perm: torch.Tensor | None = None) -> None:
        """Add a batch of patch tokens (B, N, D), CLS excluded. perm: None to score tokens at their
        indices (index coordinates, e.g. RPI against the index frame); or the batch's permutation, (N,) or
        (B, N), to un-permute tokens to their patches' positions first (content coordinates)."""
        if tokens.dim() != 3 or tokens.shape[1] != self.num_patches:
            raise ValueError(f"tokens must be (B, {self.num_patches}, D) patch tokens; got {tuple(tokens.shape)}")
        if perm is not None:
            tokens = unpermute_tokens(tokens, perm)
        batch_sum = _cosine_similarity_sum(tokens.detach()).to(torch.float64)
        self.similarity_sum = batch_sum if self.similarity_sum is None else self.similarity_sum + batch_sum
        self.count += tokens.shape[0]

    def similarity(self) -> torch.Tensor:
        """Mean cosine-similarity matrix S over every image seen: (N, N) float64."""
        if self.similarity_sum is None:
            raise ValueError("SSDCAccumulator has seen no tokens; call update() first")
        return self.similarity_sum / self.count

    def ssdc(self) -> float:
        """Spearman of {S_ij} and {-D_ij} over pairs i < j."""
        similarity = self.similarity()
        distance = pairwise_distance(self.coords, self.distance).to(similarity.device)
        i, j = torch.triu_indices(self.num_patches, self.num_patches, offset=1, device=similarity.device)
        return spearman(similarity[i, j], -distance[i, j])


class GroupSSDC:
    """The paper's estimator under RPI: SSDC of each group of images that shared a permutation (its
    evaluation batch), averaged over groups unweighted. It depends on the group size."""

    def __init__(self, grid: int):
        self.grid = grid
        self.groups: dict[int, SSDCAccumulator] = {}

    def update(self, tokens: torch.Tensor, groups: Sequence[int]) -> None:
        """Add patch tokens (B, N, D), CLS excluded, at their indices; groups: each image's group (B,)."""
        for group in dict.fromkeys(groups):
            rows = torch.tensor([b for b, g in enumerate(groups) if g == group], device=tokens.device)
            self.groups.setdefault(group, SSDCAccumulator(self.grid)).update(tokens[rows])

    def ssdc(self) -> float:
        if not self.groups:
            raise ValueError("GroupSSDC has seen no tokens; call update() first")
        return math.fsum(a.ssdc() for a in self.groups.values()) / len(self.groups)


def delta_ssdc(ssdc_per_layer: Sequence[float]) -> float:
    """dSSDC = SSDC(layer 1) - SSDC(layer 0) (Study P; measured under RPI, index coordinates)."""
    if len(ssdc_per_layer) < 2:
        raise ValueError(f"dSSDC needs SSDC of at least 2 layers; got {len(ssdc_per_layer)}")
    return float(ssdc_per_layer[1]) - float(ssdc_per_layer[0])


# --------------------------------------------------------------------------- attention statistics
# Images per chunk when AttentionAccumulator runs on the CPU: about 2**18 attention weights (1 MiB in
# float32), so the five element-wise passes over a chunk mostly hit L2 cache instead of memory. A GPU
# takes the batch whole (chunks would only add kernel launches).
_CPU_CHUNK_WEIGHTS = 1 << 18


def _attention_query_sums(attn: torch.Tensor, distance: torch.Tensor, has_cls: bool) -> tuple[torch.Tensor, ...]:
    """Per-head sums over images and patch queries of (expected key distance, the same without
    renormalising, entropy in nats, CLS mass). attn: (B, H, T, T) softmax maps; distance: (N, N) grid
    distances in attn's float dtype. The CLS row and column are dropped and each patch row renormalised
    to p = A / r, r = the row's mass on patch keys. p itself is never materialised (one pass fewer):
        sum_k p_k d_k      = (sum_k A_k d_k) / r
        -sum_k p_k log p_k = log r - (sum_k A_k log A_k) / r
    The unrenormalised distance is sum_k A_k d_k itself: the mass a query gave CLS counts as distance 0
    (the widely copied ``compute_mean_attention_dist`` convention).
    Returns four (H,) float64 tensors (the CLS one zero when not has_cls).
    """
    patch = attn[:, :, 1:, 1:] if has_cls else attn  # (B, H, N, N) view
    tiny = torch.finfo(patch.dtype).tiny
    raw_mass = patch.sum(-1)  # (B, H, N)
    # r > 0 after softmax unless every patch weight underflowed (all mass on CLS): such a row attends
    # to no patch and adds 0 distance and 0 entropy, instead of dividing by 0.
    mass = raw_mass.clamp_min(tiny)
    raw_distance = (patch * distance).sum(-1)
    expected_distance = raw_distance / mass
    # clamp_min makes 0 log 0 = 0: an underflowed weight would give 0 * -inf = NaN (xlogy does the
    # same but is ~4x slower on CPU than clamp + log + mul).
    a_log_a = (patch * patch.clamp_min(tiny).log()).sum(-1)
    entropy = torch.where(raw_mass > 0, mass.log() - a_log_a / mass, 0.0)
    # Patch-token queries only (rows 1..N): how much of each query's mass went to the CLS key.
    cls_mass = attn[:, :, 1:, 0] if has_cls else torch.zeros_like(mass)
    return tuple(v.sum((0, 2), dtype=torch.float64) for v in (expected_distance, raw_distance, entropy, cls_mass))


class AttentionAccumulator:
    """Per-head mean attention distance, entropy and CLS mass of one layer, over many batches.

    Sums per-query values over images and queries, so the means equal one pass over the concatenated
    batches. grid: side G. has_cls: whether token 0 of the maps is CLS (then dropped
    from rows and columns, and its received mass tracked as ``cls_mass``).
    """

    def __init__(self, grid: int, *, has_cls: bool = True):
        self.grid = grid
        self.has_cls = has_cls
        self._distance: torch.Tensor | None = None  # (N, N) Euclidean grid distance, on the maps' device
        self.distance_sum: torch.Tensor | None = None  # (H,) float64, in patches
        self.raw_distance_sum: torch.Tensor | None = None  # (H,) float64, in patches, rows not renormalised
        self.entropy_sum: torch.Tensor | None = None  # (H,) float64, in nats
        self.cls_mass_sum: torch.Tensor | None = None  # (H,) float64
        self.count = 0  # images x patch queries

    def update(self, attn: torch.Tensor) -> None:
        """Add a batch of softmax attention maps (B, H, T, T) of one layer."""
        if attn.dim() != 4 or attn.shape[-1] != attn.shape[-2]:
            raise ValueError(f"attn must be (B, H, T, T); got {tuple(attn.shape)}")
        batch, heads, num_tokens, _ = attn.shape
        num_patches = num_tokens - 1 if self.has_cls else num_tokens
        if self.grid * self.grid != num_patches:
            raise ValueError(f"attention has {num_patches} patch tokens, which is not grid**2 = {self.grid}**2")
        attn = attn.detach().to(torch.promote_types(attn.dtype, torch.float32))
        if self._distance is None or (self._distance.device, self._distance.dtype) != (attn.device, attn.dtype):
            self._distance = pairwise_distance(grid_coords(self.grid), "euclidean").to(attn.device, attn.dtype)
        chunk = max(1, _CPU_CHUNK_WEIGHTS // (heads * num_tokens * num_tokens)) if attn.device.type == "cpu" else batch
        for part in attn.split(chunk):
            sums = _attention_query_sums(part, self._distance, self.has_cls)
            for name, value in zip(("distance_sum", "raw_distance_sum", "entropy_sum", "cls_mass_sum"), sums):
                previous = getattr(self, name)
                setattr(self, name, value if previous is None else previous + value)
        self.count += batch * num_patches

    def _mean(self, total: torch.Tensor | None) -> torch.Tensor:
        if total is None:
            raise ValueError("AttentionAccumulator has seen no attention maps; call update() first")
        return total / self.count

    def mean_attention_distance(self, *, normalize: bool = True, renormalize: bool = True) -> torch.Tensor:
        """(H,) MAD: in [0, 1] (divided by sqrt(2)(G-1)) when ``normalize``, in patches otherwise.

        ``renormalize`` False: rows are not renormalised after dropping CLS, so a query's mass on CLS
        adds distance 0 (a CLS-sink head scores near 0 there, near uniform's level renormalised)."""
        raw = self._mean(self.distance_sum if renormalize else self.raw_distance_sum)
        return raw / max_grid_distance(self.grid) if normalize else raw

    def entropy(self) -> torch.Tensor:
        """(H,) normalised attention entropy in [0, 1] (nats / log N)."""
        return self._mean(self.entropy_sum) / math.log(self.grid * self.grid)

    def cls_mass(self) -> torch.Tensor:
        """(H,) mean attention mass that patch queries gave the CLS key."""
        if not self.has_cls:
            raise ValueError("cls_mass needs attention maps with a CLS token (has_cls=True)")
        return self._mean(self.cls_mass_sum)


# --------------------------------------------------------------------------- robustness
def fragility(acc_clean: float, acc_shift: float) -> float:
    """Fragility score FS = 1 - acc_shift / acc_clean (Study P), accuracies as fractions in [0, 1].

    FS is undefined when the clean accuracy is 0 (an untrained or collapsed model can score 0 on a small
    subset): NaN rather than raising, so one degenerate checkpoint does not abort a whole analysis job;
    NaN inputs also give NaN. Values outside [0, 1] raise ValueError (percentages or counts)."""
    acc_clean, acc_shift = float(acc_clean), float(acc_shift)
    if math.isnan(acc_clean) or math.isnan(acc_shift):
        return math.nan
    for name, value in (("acc_clean", acc_clean), ("acc_shift", acc_shift)):
        if not 0.0 <= value <= 1.0:
            raise ValueError(f"{name}={value} is not an accuracy fraction in [0, 1]")
    if acc_clean == 0.0:
        return math.nan
    return 1.0 - acc_shift / acc_clean


def paired_counts(clean_right: torch.Tensor, shift_right: torch.Tensor) -> tuple[int, int, int]:
    """(clean right and shift right, clean right and shift wrong, clean wrong and shift right) over n images.

    clean_right, shift_right: bool (n,), whether image i is classified correctly clean and under the
    shift. FS = 1 - acc_shift / acc_clean = (right_clean_only - right_shift_only) / (right_both +
    right_clean_only): the paired cells its sampling error needs (``seedstats.fragility_se``), stored as
    the metrics ``records.schema.PAIRED_COUNTS``.
    """
    if clean_right.shape != shift_right.shape or clean_right.dim() != 1:
        raise ValueError(f"need two (n,) masks over the same images; got {tuple(clean_right.shape)} and "
                         f"{tuple(shift_right.shape)}")
    clean_right, shift_right = clean_right.bool(), shift_right.bool()
    return (int((clean_right & shift_right).sum()), int((clean_right & ~shift_right).sum()),
            int((~clean_right & shift_right).sum()))
