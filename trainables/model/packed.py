"""Packed trials: K same-shaped ViTs trained as one model, each member still its own trial.

Why: a `study_l` step at batch 128 is a few hundred small kernels, bound by launch latency on a GPU.
Stacking K members' parameters and mapping the one `ViT` over them with `torch.func.vmap` turns
K x few hundred small kernels into few hundred K-times-larger ones (the PyTorch model-ensembling
recipe; HFTA, MLSys 2021, fuses whole training runs the same way).

How (K members, B batch per member, S image side, C classes, N patches):

    models = [init_member(cfg) for cfg in cfgs]           # each from its own seed, as the unpacked run
    params, buffers = stack_module_state(models)          # {name: (K, *shape)} leaves, requires_grad
    logits = vmap(functional_call(meta copy of the ViT))  # (K, B, 3, S, S) -> (K, B, C)
    loss = losses(logits, targets).sum()                  # (K,) -> (); one ordinary backward()
    optimizer over the stacked leaves                     # AdamW / Adam are element-wise: one = K

Each member is trained as if alone: the packed loss is the sum of member losses and no op mixes the K slices, so member
k's gradient is exactly the gradient of its own loss; the optimiser update is element-wise, so a stacked AdamW equals K
AdamWs. What differs per member is drawn by the loop per member: data order, augmentation draws, CutMix, RPT
permutations (`perm`), applied to the whole pack at once (`augment.step_batch`), and label smoothing (`losses` reads it
from each member's RunConfig). What must be equal is the pack key (`pack_key`): every run-config field except
`PACK_FREE_FIELDS`.

Care under vmap:
  * attention: fused `scaled_dot_product_attention` where the device's fused kernels have a vmap
    batching rule (CUDA), the explicit softmax path where they have none (CPU: vmap would fall back
    to a per-member loop), chosen in one place, `fused_attention_under_vmap`; a fused call that fails
    on the first step falls back to the explicit path (`pack.fast_paths`, `trainables.model.fast_paths`);
  * Linear: each block's Linear layers run as one matmul with the bias, and the LayerNorm before
    qkv and fc1, folded in (`trainables.model.folded`: vmap would split the bias add from the matmul);
    under autocast the folded weights are made in bf16, so Linear outputs are bf16 as in the plain
    module (vmap hides the Linear from autocast, and an fp32 bias add would promote them to fp32);
  * RPT: members differ (no RPT, one permutation per batch (N,), one per image (B, N)), so every
    member's permutation is expanded to (B, N) and gathered; a gather reproduces `patches[:, perm]`
    exactly, and no RPT in any member passes no permutation at all;
  * randomness: vmap runs with randomness="error"; dropout and drop path would need per-member draws,
    so configs with them are refused (`pack_blocker`) and stay K = 1;
  * RoPE: tables are buffers (stacked, identical per member); RoPE-Mixed's learned `freqs` are
    ordinary stacked parameters; nothing runs in place on a parameter.

Optimiser decay groups come from the loop's own `build_optimizer` applied to the unstacked template
model (`PackedViT.optimizer(build_optimizer, cfg)`): stacked biases have ndim 2, so a rule on `p.ndim`
applied to the stacked leaves would decay them.

K = 1 is the plain module itself (`pack.module`; `pack.stacked` is False): fused attention, DDP and
torch.compile through `pack.wrap`, and bit for bit the numbers of the unpacked loop; the same calls
below only add the leading K = 1 axis. So one loop serves K = 1 (and DDP) and K > 1. For K > 1
`pack.wrap` wraps the vmapped forward (`torch.compile`, `trainables.model.compiled`).

API for the training loop (the loop keeps per-member lists indexed like `pack.configs`):

    pack = PackedViT(cfgs, device)                        # or PackedViT(cfgs, device, models=[...])
    optimizer = pack.optimizer(build_optimizer, cfgs[0])
    scheduler = LambdaLR(optimizer, ...)                  # one schedule: epochs/warm-up are in the key
    pack.train()
    logits = pack(images, perm)                           # images (K, B, 3, S, S); perm: K entries
    per_member = pack.losses(logits, targets)             # targets (K, B, C) soft -> (K,)
    optimizer.zero_grad(); per_member.sum().backward(); optimizer.step(); scheduler.step()
    pack.eval(); logits = pack(eval_images)               # shared (B, 3, S, S) -> (K, B, C)
    pack.member_state_dict(k) / pack.load_member_state_dict(k, sd)        # as ViT.state_dict()
    pack.member_optimizer_state(optimizer, k) / load_member_optimizer_state(optimizer, k, sd)
                                                          # as the unpacked optimizer.state_dict()
    pack.drop(optimizer, [j])                             # a diverged member leaves; K shrinks

Per-trial checkpoints are the unpacked formats, so a trial resumes packed or unpacked.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, stack_module_state, vmap

from trainables.data.images import to_device
from trainables.model import folded
from trainables.model.fast_paths import FastPaths
from trainables.model.vit import ViT
from trainables.config.run_config import RunConfig
from trainables.config.pack_keys import PACK_FREE_FIELDS, pack_blocker, pack_key

OptimizerFactory = Callable[[nn.Module, RunConfig], torch.optim.Optimizer]


def init_member(cfg: RunConfig) -> ViT:
    """The weights the unpacked run starts from: `train()` seeds torch with cfg.seed, then builds the
    ViT before drawing anything else from the global generator (tests/test_packed.py checks this
    against `train()`'s epoch-0 snapshot)."""
    torch.manual_seed(cfg.seed)
    return ViT(cfg.model)


@contextlib.contextmanager
def mixed_precision(device: torch.device, enabled: bool):
    """The step's and the evaluation's precision, in one place: bf16 autocast when `enabled`, and
    on CUDA TF32 for whatever fp32 matmuls and convolutions remain (restored on exit), set through
    the per-backend `fp32_precision` API (the `allow_tf32` flags are deprecated)."""
    device = torch.device(device)
    cuda = enabled and device.type == "cuda"
    backends = (torch.backends.cuda.matmul, torch.backends.cudnn.conv)
    saved = [b.fp32_precision for b in backends] if cuda else None
    if cuda:
        for backend in backends:
            backend.fp32_precision = "tf32"
    try:
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=enabled):
            yield
    finally:
        if saved is not None:
            for backend, value in zip(backends, saved):
                backend.fp32_precision = value


def fused_attention_under_vmap(device: torch.device | str) -> bool:
    """The one place that chooses the packed forward's attention. CUDA's fused kernels (flash,
    memory-efficient, cuDNN) have vmap batching rules, so the pack runs them as the plain module
    does, with no (K, B, H, T, T) maps kept for backward. The CPU's fused kernel has none (vmap
    would fall back to a loop over members with a performance warning), so there the pack runs the
    explicit softmax attention (`ViT.forward(explicit_attention=True)`)."""
    return torch.device(device).type == "cuda"


def _full_perm(perm: torch.Tensor | None, batch: int, n: int, device: torch.device) -> torch.Tensor:
    """A member's RPT permutation as (B, N): None -> identity, (N,) -> the same for every image."""
    if perm is None:
        return torch.arange(n, device=device).expand(batch, n)
    perm = perm.to(device)
    return perm.expand(batch, n) if perm.ndim == 1 else perm


class PackedViT:
    """K same-shaped ViTs (one per RunConfig) as stacked parameters; see the module docstring."""

    def __init__(
        self, configs: Sequence[RunConfig], device: str | torch.device = "cpu", *, models: Sequence[ViT] | None = None,
        log: Callable[[str], None] = print,
    ):
        if not configs:
            raise ValueError("a pack needs at least one member config")
        if len({pack_key(c) for c in configs}) > 1:
            diff = sorted({k for k, v in pack_key(configs[0]) if any(dict(pack_key(c))[k] != v for c in configs)})
            raise ValueError(f"pack members differ in {diff}; they may differ only in {list(PACK_FREE_FIELDS)}")
        for c in configs:
            reason = pack_blocker(c)
            if reason and len(configs) > 1:
                raise ValueError(f"trial {c.trial_id} cannot be packed: {reason}")
        ids = [c.trial_id for c in configs]
        if len(set(ids)) != len(ids):
            raise ValueError(f"a pack holds each trial once; repeated: {sorted({i for i in ids if ids.count(i) > 1})}")
        self.device = torch.device(device)
        self.configs = list(configs)
        self.fast_paths = FastPaths(log)
        models = [init_member(c) for c in configs] if models is None else list(models)
        if len(models) != len(configs):
            raise ValueError(f"{len(models)} models for {len(configs)} member configs")
        # Structure only (functional_call swaps tensors in), taken before the move to the device.
        base = copy.deepcopy(models[0]).to("meta") if len(models) > 1 else None
        models = [m.to(self.device) for m in models]
        self._n_patches = configs[0].model.num_patches
        self._smoothing = self._smoothing_table()
        if len(models) == 1:
            # K = 1 is the plain module itself: fused attention, DDP and torch.compile as before
            # packing, and the very numbers of an unpacked run; only the (K, ...) shapes are added.
            self.module: ViT | None = models[0]
            self.forward_module: Callable[..., Any] = self.module
            self.template = self.module
            self.params, self.buffers = dict(self.module.named_parameters()), {}
            return
        self.module = None
        # The template keeps the real module: state_dict keys (persistent buffers only), the decay
        # groups, and non-persistent buffers (RoPE / sin-cos tables).
        self.template = copy.deepcopy(models[0])
        self.params, self.buffers = stack_module_state(models)  # {name: (K, *shape)}
        self.base = base
        self.forward_stacked: Callable[..., torch.Tensor] = self._vmapped
        self.explicit_attention = not fused_attention_under_vmap(self.device)
        if not self.explicit_attention:
            self.fast_paths.add("the fused attention under vmap", "the explicit softmax attention",
                                lambda: setattr(self, "explicit_attention", True))
        self._folds = folded.fold_linears(self.base)
        # What autocast runs in low precision inside the plain module and vmap hides from it: Linear.
        self._low_precision = {f"{name}.{leaf}" for name, module in self.base.named_modules()
                               if isinstance(module, nn.Linear) for leaf, _ in module.named_parameters()}

    # -- shape of the pack ---------------------------------------------------------------------------
    @property
    def k(self) -> int:
        return len(self.configs)

    @property
    def trial_ids(self) -> list[str]:
        return [c.trial_id for c in self.configs]

    @property
    def stacked(self) -> bool:
        """True when the members' parameters are stacked (K > 1 at creation), False for the plain module."""
        return self.module is None

    @property
    def training(self) -> bool:
        return (self.base if self.stacked else self.module).training

    def parameters(self) -> list[torch.Tensor]:
        return list(self.params.values())

    def train(self, mode: bool = True) -> PackedViT:
        (self.base if self.stacked else self.module).train(mode)
        return self

    def wrap(self, wrapper: Callable[[Callable[..., Any]], Callable[..., Any]]) -> Callable[[], None]:
        """Run the forward through `wrapper(forward)`: K = 1 the module's (DDP, then torch.compile),
        K > 1 the vmapped forward (`forward_stacked(params, buffers, images, perm, explicit)`:
        torch.compile). Checkpoints still come from the unwrapped parameters. Returns what undoes
        this wrap (a fast path's fallback)."""
        name = "forward_stacked" if self.stacked else "forward_module"
        before = getattr(self, name)
        setattr(self, name, wrapper(before))
        return lambda: setattr(self, name, before)

    def eval(self) -> PackedViT:
        return self.train(False)

    # -- step ----------------------------------------------------------------------------------------
    def __call__(self, images: torch.Tensor, perm: Sequence[torch.Tensor | None] | torch.Tensor | None = None):
        return self.forward(images, perm)

    def forward(
        self, images: torch.Tensor, perm: Sequence[torch.Tensor | None] | torch.Tensor | None = None
    ) -> torch.Tensor:
        """images (K, B, 3, S, S), one batch per member, or (B, 3, S, S) shared (evaluation)
        -> logits (K, B, C).

        perm: None (no member permutes), a (K, B, N) tensor, or K entries each None, (N,) or (B, N),
        exactly what each member's unpacked run would pass as the ViT's `perm`."""
        shared = images.ndim == 4
        if not self.stacked:
            p = perm[0] if perm is not None else None
            return self.forward_module(images if shared else images[0], perm=p).logits[None]
        if not shared and images.shape[0] != self.k:
            raise ValueError(f"images have {images.shape[0]} member batches for a pack of K={self.k}")
        batch = images.shape[-4]
        if perm is not None and not torch.is_tensor(perm):
            if len(perm) != self.k:
                raise ValueError(f"perm has {len(perm)} entries for a pack of K={self.k}")
            if all(p is None for p in perm):
                perm = None
            else:
                perm = torch.stack([_full_perm(p, batch, self._n_patches, images.device) for p in perm])

        return self.forward_stacked(self.params, self.buffers, images, perm, self.explicit_attention)

    def _vmapped(self, params: dict[str, torch.Tensor], buffers: dict[str, torch.Tensor], images: torch.Tensor,
                 perm: torch.Tensor | None, explicit: bool) -> torch.Tensor:
        """The members' forward: stacked params and buffers (K, ...), images (K, B, 3, S, S) or shared
        (B, 3, S, S), perm (K, B, N) or None -> logits (K, B, C). What `wrap` compiles: one graph."""
        def member(params, buffers, x, p):
            out = functional_call(self.base, (params, buffers), (x,), {"perm": p, "explicit_attention": explicit})
            return out.logits

        # Under autocast Linear runs in its low precision, as the plain module's does: vmap hides it
        # from autocast (an fp32 bias add would promote its output to fp32), so its weights are cast
        # here, in the graph that `wrap` compiles, as autocast would; fp32 leaves, fp32 gradients.
        device = images.device.type
        dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else None
        params = folded.fold_params(params, self._folds, self._low_precision, dtype)
        in_dims = (0, 0, None if images.ndim == 4 else 0, None if perm is None else 0)
        return vmap(member, in_dims=in_dims, randomness="error")(params, buffers, images, perm)

    def losses(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """logits (K, B, C), soft targets (K, B, C) -> (K,) mean cross-entropy per member, each with its
        own label smoothing: F.cross_entropy's rule for probability targets, t (1 - eps) + eps / C."""
        if not self.stacked:  # exactly the unpacked run's loss
            smoothing = self.configs[0].protocol.smoothing
            return F.cross_entropy(logits[0].float(), targets[0], label_smoothing=smoothing)[None]
        eps = self._smoothing  # (K, 1, 1) on the device, made once: not a host-to-device copy per step
        smoothed = targets * (1 - eps) + eps / logits.shape[-1]
        return -(smoothed * logits.float().log_softmax(-1)).sum(-1).mean(-1)

    def _smoothing_table(self) -> torch.Tensor:
        table = torch.tensor([c.protocol.smoothing for c in self.configs], dtype=torch.float32)[:, None, None]
        return to_device(table, self.device)

    # -- optimiser -------------------------------------------------------------------------------------
    def optimizer(self, build: OptimizerFactory, cfg: RunConfig | None = None) -> torch.optim.Optimizer:
        """`build(model, cfg)` (the loop's `build_optimizer`) applied to the unstacked template, its
        parameters then swapped for the stacked leaves group by group: the decay rule stays in one
        place, and the parameter order equals the unpacked optimiser's (so its state_dict maps 1:1)."""
        optimizer = build(self.template, cfg or self.configs[0])
        if not self.stacked:
            return optimizer
        if optimizer.state:
            raise ValueError("build() returned an optimiser that already holds state")
        name_of = {id(p): name for name, p in self.template.named_parameters()}
        for group in optimizer.param_groups:
            group["params"] = [self.params[name_of[id(p)]] for p in group["params"]]
        return optimizer

    # -- per member: checkpoints, snapshots, failures --------------------------------------------------
    def member_state_dict(self, k: int) -> dict[str, torch.Tensor]:
        """Member k's weights with the keys and shapes of `ViT.state_dict()` (persistent buffers only)."""
        if not self.stacked:
            return {name: value.detach().clone() for name, value in self.module.state_dict().items()}
        stacked = {**self.params, **self.buffers}
        return {name: stacked[name][k].detach().clone() for name in self.template.state_dict()}

    @torch.no_grad()
    def load_member_state_dict(self, k: int, state: dict[str, torch.Tensor]) -> None:
        expected = set(self.template.state_dict())
        if set(state) != expected:
            raise ValueError(f"state of member {k} has keys {sorted(set(state) ^ expected)} that do not match the ViT")
        if not self.stacked:
            self.module.load_state_dict(state)
            return
        stacked = {**self.params, **self.buffers}
        for name, value in state.items():
            stacked[name][k].copy_(value)

    @staticmethod
    def _stacked_params(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
        return [p for group in optimizer.param_groups for p in group["params"]]

    def member_optimizer_state(self, optimizer: torch.optim.Optimizer, k: int) -> dict[str, Any]:
        """Member k's slice of the optimiser, in the format of the unpacked optimiser's state_dict()
        (per-parameter tensors shaped like the parameter are sliced; scalars such as `step` are shared)."""
        if not self.stacked:
            return copy.deepcopy(optimizer.state_dict())
        state = optimizer.state_dict()
        params = self._stacked_params(optimizer)
        state["state"] = {i: {key: _slice(v, params[i], k) for key, v in slot.items()}
                          for i, slot in state["state"].items()}
        return state

    @torch.no_grad()
    def load_member_optimizer_state(self, optimizer: torch.optim.Optimizer, k: int, state: dict[str, Any]) -> None:
        """Write an unpacked optimiser state_dict (a trial's checkpoint) into member k's slice, and its
        group settings (lr, initial_lr, ...) into the groups, as `Optimizer.load_state_dict` does.
        Members of one pack resume from the same epoch, so shared scalars (`step`) must agree.
        Order as in train(): build optimiser and scheduler, load optimiser state, then scheduler state."""
        if not self.stacked:
            optimizer.load_state_dict(state)
            return
        params = self._stacked_params(optimizer)
        if len(state["param_groups"]) != len(optimizer.param_groups) or \
                sum(len(g["params"]) for g in state["param_groups"]) != len(params):
            raise ValueError(f"the optimiser state of member {k} does not match this pack's parameter groups")
        for group, saved in zip(optimizer.param_groups, state["param_groups"]):
            # lr (set by the scheduler), initial_lr, betas...: one schedule for the whole pack.
            group.update({key: value for key, value in saved.items() if key != "params"})
        group_of = {id(p): group for group in optimizer.param_groups for p in group["params"]}
        for i, slot in state["state"].items():
            p = params[int(i)]
            mine = optimizer.state[p]
            # `step` where Optimizer.load_state_dict puts it: the parameter's device for a fused (or
            # capturable) optimiser, whose kernels read it there; else the host, where foreach reads it.
            on_device = group_of[id(p)].get("fused") or group_of[id(p)].get("capturable")
            slot = {key: value.to(p.device, torch.float32) if key == "step" and on_device and torch.is_tensor(value)
                    else value for key, value in slot.items()}
            for key, value in slot.items():
                if torch.is_tensor(value) and tuple(value.shape) == tuple(p.shape[1:]):
                    if key not in mine:
                        mine[key] = torch.zeros_like(p, dtype=value.dtype)
                    mine[key][k].copy_(value)
                elif key in mine and not _equal(mine[key], value):
                    raise ValueError(f"optimiser {key!r} of member {k} is {value}, the pack's is {mine[key]}: "
                                     "members of one pack must resume from the same step")
                else:
                    mine[key] = value.clone() if torch.is_tensor(value) else value

    @torch.no_grad()
    def drop(self, optimizer: torch.optim.Optimizer | None, members: Iterable[int]) -> list[int]:
        """Remove `members` (indices into the current pack) in place; returns the kept old indices,
        so the loop can re-index its per-member lists. The optimiser keeps its identity (a scheduler
        holding it goes on) and its state for the kept members."""
        gone = set(members)
        keep = [i for i in range(self.k) if i not in gone]
        if not gone:
            return keep
        if not keep or not self.stacked:
            raise ValueError("cannot drop every member of a pack; end the pack instead")
        index = torch.tensor(keep, device=self.device)
        fresh = {name: p[index].detach().clone().requires_grad_(p.requires_grad) for name, p in self.params.items()}
        if optimizer is not None:
            old_to_new = {id(p): fresh[name] for name, p in self.params.items()}
            for group in optimizer.param_groups:
                for j, p in enumerate(group["params"]):
                    new = old_to_new[id(p)]
                    if p in optimizer.state:
                        slot = optimizer.state.pop(p)
                        optimizer.state[new] = {
                            key: v[index].clone() if torch.is_tensor(v) and v.shape == p.shape else v
                            for key, v in slot.items()
                        }
                    group["params"][j] = new
        self.params = fresh
        self.buffers = {name: b[index].clone() for name, b in self.buffers.items()}
        self.configs = [self.configs[i] for i in keep]
        self._smoothing = self._smoothing_table()
        return keep


def _slice(value: Any, param: torch.Tensor, k: int) -> Any:
    if torch.is_tensor(value) and value.shape == param.shape:
        return value[k].clone()
    return value.clone() if torch.is_tensor(value) else value


def _equal(a: Any, b: Any) -> bool:
    if torch.is_tensor(a) or torch.is_tensor(b):
        return torch.equal(torch.as_tensor(a).cpu(), torch.as_tensor(b).cpu())
    return a == b
