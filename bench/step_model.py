"""A measured model of the packed training step on an H200 and an H100, from the CPU: kernels, bytes, FLOPs.

    PYTHONPATH=. python3 bench/step_model.py            # study_l, APE and RoPE, K = 1, 8, 16 (minutes, 2 cores)
    PYTHONPATH=. python3 bench/step_model.py --k 8 --pe ape

One step of `train.pack_step` (normalise, the packed forward, per-member loss, backward, AdamW) on a
batch of 128 CIFAR-sized images per member, `study_l`, bf16 autocast, traced on fake tensors (shapes
only: nothing is computed, so K = 16 costs what K = 1 does):

* eager: a dispatch census of every op: kernels = ops that compute (views, allocations, metadata and host
  scalars left out); bytes = every op's tensor inputs and outputs (a view or a broadcast counts the memory
  it can reach, no more; an op that writes in place and returns nothing, as the optimisers' foreach and
  fused kernels, counts what it writes once more); matmul FLOPs = 2 x the multiply-adds of matmuls,
  convolutions and attention;
* compiled (`trainables.model.compiled`: the vmapped forward and its backward, one graph): inductor's own
  count of the bytes its kernels access (`torch._inductor.metrics.num_bytes_accessed`, inductor's
  metrics log on) and its scheduler's kernels, for that graph; the rest of the step as eager. The
  kernels are inductor's CPU fusion standing in for Triton's (the same scheduler, with the CPU
  backend's fusion rules); lowered and scheduled only: no kernel source written, nothing runs;
* attention: the GPU's fused kernel, modelled as one op per direction (forward reads q, k, v and
  writes out and the log-sum-exp; backward reads those and dout, writes dq, dk, dv), batched over
  the members as CUDA's batching rule does; the CPU has no such kernel under vmap.
* autocast: the CPU's bf16 autocast stands in for CUDA's (both run matmuls and convolutions in
  bf16; LayerNorm, softmax and the loss in fp32); one-hot targets as CUDA makes them (a fill and
  a scatter: the CPU's one_hot first reads its input's range on the host).

Before: this issue's starting point (foreach AdamW, RoPE tables in fp32, q, k, v split head-major,
RoPE's pairs turned by quarters and a cat, each Linear a matmul and a bias add; eager only: packs were
not compiled). After: fused AdamW, RoPE in the autocast dtype, q, k, v split token-major
(`vit.split_heads`), pairs swapped by a flip (`pos_embed.swap_pairs`), the packed Linear layers' biases
and LayerNorms folded into their matmuls (`trainables.model.folded`: matmul FLOPs count the padded width);
eager, and compiled. Each row's estimate, one column per card from the same census, follows from
the fixed assumptions printed at the top:

    time per step = max(bytes / bandwidth + FLOPs / matmul rate, kernels x host cost per kernel)

The cards differ in bandwidth only (`CARDS`): the H200 at 3.0 TB/s achieved (the figure every
estimate of this project used); the H100, which a lent device machine gives first, at 2.4 TB/s
achieved, an assumption: 80% of the 3.0 TB/s its copy measured. The matmul rate and the host costs
are the same for both (the same SMs, clocks and host). A result measured on a card is compared with
that card's column.

An estimate, not a measurement: bench/gpu_suite.py measures the step on a GPU.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from fake_cuda import clear_device_constants  # noqa: E402

from trainables.loop import optim, train  # noqa: E402
from trainables.model import folded, pos_embed, vit
from trainables.model.packed import PackedViT  # noqa: E402
from trainables.config.run_config import RunConfig  # noqa: E402

HBM_BYTES_PER_S = 3.0e12  # achieved HBM bandwidth, H200
# Achieved HBM bandwidth per card, the column order of the table. The H100's is assumed: 80% of the
# 3.0 TB/s a device-to-device copy measured on the lent H100 (achieved kernels reach less than a copy).
CARDS = {"H200": HBM_BYTES_PER_S, "H100": 0.8 * 3.0e12}
MATMUL_FLOP_PER_S = 400e12  # achieved bf16 matmul rate
EAGER_LAUNCH_S = 5e-6  # host time per eager kernel launch
COMPILED_LAUNCH_S = 2e-6  # host time per compiled kernel
BATCH = 128
TARGET = 100_000

aten = torch.ops.aten
# Ops that launch nothing: allocations, host scalars, metadata.
_NO_KERNEL = {aten.empty.memory_format, aten.empty_strided.default, aten.empty_like.default, aten.new_empty.default,
              aten.new_empty_strided.default, aten._local_scalar_dense.default, aten.lift_fresh.default,
              aten.detach.default, aten.set_.source_Storage_storage_offset, aten.resize_.default,
              aten._unsafe_view.default}


# -- the fused attention as the GPU runs it --------------------------------------------------------
@torch.library.custom_op("step_model::attention", mutates_args=())
def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    raise NotImplementedError("shapes only: the census runs on fake tensors")


@attention.register_fake
def _(q, k, v):
    return torch.empty_like(q), q.new_empty(q.shape[:-1], dtype=torch.float32)


@torch.library.custom_op("step_model::attention_backward", mutates_args=())
def attention_backward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, lse: torch.Tensor,
                       dout: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    raise NotImplementedError("shapes only")


@attention_backward.register_fake
def _(q, k, v, out, lse, dout):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def _setup(ctx, inputs, output):
    ctx.save_for_backward(*inputs, *output)


def _backward(ctx, dout, dlse):
    q, k, v, out, lse = ctx.saved_tensors
    return attention_backward(q, k, v, out, lse, dout)


attention.register_autograd(_backward, setup_context=_setup)


def _batched(info, in_dims, *tensors):
    """Fold the members' axis into the batch, as CUDA's batching rule for the fused kernels does."""
    front = [t.movedim(d, 0) if d is not None else t.expand(info.batch_size, *t.shape)
             for t, d in zip(tensors, in_dims)]
    return [t.flatten(0, 1) for t in front], info.batch_size


@attention.register_vmap
def _(info, in_dims, q, k, v):
    (q, k, v), n = _batched(info, in_dims, q, k, v)
    out, lse = attention(q, k, v)
    return (out.unflatten(0, (n, -1)), lse.unflatten(0, (n, -1))), (0, 0)


@attention_backward.register_vmap
def _(info, in_dims, *tensors):
    flat, n = _batched(info, in_dims, *tensors)
    return tuple(g.unflatten(0, (n, -1)) for g in attention_backward(*flat)), (0, 0, 0)


def fused_sdpa(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, **kwargs):
    return attention(q, k, v)[0]


# -- the census ------------------------------------------------------------------------------------
def _reach(t: torch.Tensor) -> int:
    """Bytes an op can touch through `t`: its elements, at most its storage (a broadcast reads less)."""
    elements = t.numel() * t.element_size()
    try:
        return min(elements, t.untyped_storage().nbytes())
    except (RuntimeError, NotImplementedError):
        return elements


def matmul_flops(func, args, out) -> int:
    """Multiply-adds x 2 of the matmuls, convolutions and attention among the step's ops."""
    if func in (aten.mm.default, aten.addmm.default, aten.bmm.default, aten.baddbmm.default):
        a, b = args[-2:]
        return 2 * a.numel() * b.shape[-1]
    if func is aten.convolution.default:
        weight = args[1]
        return 2 * out.numel() * weight[0].numel()
    if func is aten.convolution_backward.default:
        grad_out, weight, mask = args[0], args[2], args[-1]
        return 2 * grad_out.numel() * weight[0].numel() * sum(mask[:2])
    if func is torch.ops.step_model.attention.default:  # QK^T and PV
        q = args[0]
        return 4 * q.numel() * q.shape[-2]
    if func is torch.ops.step_model.attention_backward.default:  # QK^T again, then dV, dP, dQ, dK
        q = args[0]
        return 10 * q.numel() * q.shape[-2]
    return 0


def _written_in_place(func, args, kwargs, out) -> list[torch.Tensor]:
    """What an op that returns nothing writes: its mutable arguments (the foreach optimiser's `_foreach_*_`
    and the fused `_fused_adamw_`, which writes its grads only when it unscales them). An in-place op
    that returns its result (`add_`) is counted through its output."""
    if any(isinstance(t, torch.Tensor) for t in tree_flatten(out)[0]):
        return []
    bound = {**{a.name: v for a, v in zip(func._schema.arguments, args)}, **kwargs}
    return [t for a in func._schema.arguments if a.alias_info is not None and a.alias_info.is_write
            and not (a.name == "grads" and bound.get("grad_scale") is None)
            for t in tree_flatten(bound.get(a.name))[0] if isinstance(t, torch.Tensor)]


class Census(TorchDispatchMode):
    """Kernels, bytes and matmul FLOPs of the ops dispatched under it (see the module docstring)."""

    def __init__(self):
        super().__init__()
        self.kernels = self.bytes = self.flops = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func.namespace not in ("aten", "step_model") or func.is_view or func in _NO_KERNEL:
            return out  # metadata (prim.device), views, allocations
        tensors = [t for t in tree_flatten((args, kwargs, out))[0] if isinstance(t, torch.Tensor)]
        if not tensors or all(t.dim() == 0 for t in tensors):  # host scalars (foreach's step counters)
            return out
        self.kernels += 1
        self.bytes += sum(_reach(t) for t in tensors + _written_in_place(func, args, kwargs or {}, out))
        self.flops += matmul_flops(func, args, out)
        return out


@contextlib.contextmanager
def variant(before: bool) -> Iterator[None]:
    """The code as it was before this issue (foreach AdamW, fp32 RoPE tables, q, k, v split
    head-major, RoPE's pairs turned by cutting quarters and a cat, Linear biases and LayerNorms
    unfolded) or as it is."""
    if not before:
        yield
        return
    build = optim.build_optimizer
    dtype = pos_embed.step_dtype
    heads = vit.split_heads
    fold = folded.fold_linears

    tables, rotate = pos_embed.pair_tables, vit.apply_rotation

    def head_major(qkv, heads):  # q, k, v unbound after a head-major permute
        B, T, D3 = qkv.shape
        return qkv.reshape(B, T, 3, heads, D3 // (3 * heads)).permute(2, 0, 3, 1, 4).unbind(0)

    def unsigned_tables(angles):
        a, b = angles.chunk(2, dim=-1)
        full = torch.cat([a, a, b, b], dim=-1)
        return full.cos(), full.sin()

    def rotate_by_quarters(x, cos, sin):  # x cos + [-x2, x1, -x4, x3] sin, the quarters cut and catted
        x1, x2, x3, x4 = x.chunk(4, dim=-1)
        return (x * cos + torch.cat([-x2, x1, -x4, x3], dim=-1) * sin).to(x.dtype)

    def foreach(model, cfg):
        optimizer = build(model, cfg)
        for group in optimizer.param_groups:
            group["fused"], group["foreach"] = False, True
        return optimizer

    optim.build_optimizer, pos_embed.step_dtype, vit.split_heads = foreach, (lambda cos, sin: (cos, sin)), head_major
    folded.fold_linears = lambda base: []
    pos_embed.pair_tables, vit.apply_rotation = unsigned_tables, rotate_by_quarters
    try:
        yield
    finally:
        optim.build_optimizer, pos_embed.step_dtype, vit.split_heads = build, dtype, heads
        pos_embed.pair_tables, vit.apply_rotation = tables, rotate
        folded.fold_linears = fold


def _configs(pe: str, k: int) -> list[RunConfig]:
    return [RunConfig.for_dataset("cifar10", preset="study_l", pe=pe, seed=seed, batch_size=BATCH, data_root="/unused",
                                  device="cpu") for seed in range(k)]


def _pack(cfgs, mode: FakeTensorMode) -> PackedViT:
    """The pack built on real CPU tensors (Module.to cannot swap a fake parameter with itself), then
    every tensor the step touches made fake."""
    pack = PackedViT(cfgs, "cpu", log=lambda line: None).train()
    pack.explicit_attention = False  # the GPU's fused attention (the CPU would take the explicit path)

    def fake(t):
        return mode.from_tensor(t.detach()).requires_grad_(t.requires_grad)

    if pack.stacked:
        pack.params = {name: fake(p) for name, p in pack.params.items()}
        pack.buffers = {name: fake(b) for name, b in pack.buffers.items()}
    else:
        for module in pack.module.modules():
            for name, p in module._parameters.items():
                if p is not None:
                    module._parameters[name] = torch.nn.Parameter(fake(p), requires_grad=p.requires_grad)
            for name, b in module._buffers.items():
                if b is not None:
                    module._buffers[name] = fake(b)
        pack.params = dict(pack.module.named_parameters())
    return pack


def census(pe: str, k: int, *, before: bool, compiled: bool) -> dict[str, dict]:
    """Kernels per step, bytes and matmul FLOPs per image of one steady-state step (the second):
    {"eager": row} and, when `compiled`, {"compiled": row} (the same step, its vmapped forward and
    backward counted as inductor lowers them)."""
    cfgs = _configs(pe, k)
    clear_device_constants()  # none made in another fake mode
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    with variant(before):
        pack = _pack(cfgs, mode)
    with variant(before), mode:
        optimizer = pack.optimizer(optim.build_optimizer, cfgs[0])
        batches = [(torch.randint(0, 256, (BATCH, 3, 32, 32), dtype=torch.uint8), torch.randint(0, 10, (BATCH,)))
                   for _ in cfgs]
        gens = [torch.Generator() for _ in cfgs]

        def step():
            train.pack_step(pack, optimizer, cfgs, batches, num_classes=10, mean=(0.5,) * 3, std=(0.25,) * 3,
                            mix_gens=gens, perm_gens=gens, use_amp=True)

        with torch.autocast("cpu", dtype=torch.bfloat16):
            step()  # the optimiser's state is made
            counted = Census()
            with counted:
                step()
            n = k * BATCH
            rows = {"eager": {"kernels": counted.kernels, "mb_per_image": counted.bytes / n / 1e6,
                              "gflop_per_image": counted.flops / n / 1e9, "images_per_step": n}}
            if compiled:
                forward, args = _region(pack, cfgs)
                region = Census()
                with region:
                    _region_step(forward, args)
                graph = inductor_census(forward, args)
                rest = counted.bytes - region.bytes
                rows["compiled"] = {**rows["eager"], "kernels": counted.kernels - region.kernels + graph["kernels"],
                                    "mb_per_image": (rest + graph["bytes"]) / n / 1e6,
                                    "parts_mb_per_image": {"forward graph": graph["forward"] / n / 1e6,
                                                           "backward graph": graph["backward"] / n / 1e6,
                                                           "rest of the step (eager)": rest / n / 1e6}}
    clear_device_constants()
    return rows


def _region(pack, cfgs):
    """What the loop compiles, and its inputs: K > 1 the vmapped forward over the stacked parameters,
    which enter as leaves (their folds and casts in the graph); K = 1 the plain module (its
    parameters and autocast's casts inside the graph)."""
    x = torch.randn(len(cfgs), BATCH, 3, 32, 32)
    if not pack.stacked:
        for p in pack.params.values():  # as after the step's zero_grad: the backward accumulates nothing
            p.grad = None
        return (lambda x: pack.forward_module(x).logits), (x[0],)
    params = {n: p.detach().requires_grad_() for n, p in pack.params.items()}
    return (lambda params, x: pack.forward_stacked(params, pack.buffers, x, None, False)), (params, x)


def _region_step(forward, args) -> None:
    logits = forward(*args)
    logits.backward(torch.ones_like(logits))


def inductor_census(forward, args) -> dict:
    """Inductor's kernels and bytes (`GraphLowering.count_bytes`, what `num_bytes_accessed` sums) of
    the compiled forward and its backward: lowered and scheduled (fused), no kernel source written.

    One counting rule set here: inductor lowers a variance over few elements (LayerNorm's 192) in two
    passes on the CPU (`config.cpp.use_two_step_variance_threshold`, 1024) but as one Welford
    reduction for CUDA's fp32 inputs (threshold `unroll_reductions_threshold`, 8), so the CPU's
    lowering would read every LayerNorm's input three times where CUDA's reads it once; the CUDA
    choice is taken."""
    from torch._functorch import config as functorch_config
    from torch._inductor import config as inductor_config
    from torch._inductor import metrics
    from torch._inductor.graph import GraphLowering

    kernels, graph_bytes = [], []

    class Uncompiled:  # scheduled, never generated: no kernel source written, nothing compiled or run
        __file__ = "step_model"

        def call(self, *args):
            raise _Counted

    def schedule_only(graph):  # what `graph.codegen()` does before it writes the kernels' source
        graph.init_wrapper_code()
        graph._update_scheduler()
        kernels.append(len(graph.scheduler.nodes))
        graph_bytes.append(graph.count_bytes()[0])
        return Uncompiled()

    torch._dynamo.reset()
    metrics.reset()
    quiet = contextlib.redirect_stderr(io.StringIO())  # the metrics log's per-node lines
    quiet.__enter__()
    torch._logging.set_logs(inductor_metrics=True)  # inductor counts its bytes only with its metrics log on
    saved = (GraphLowering.compile_to_module, functorch_config.force_non_lazy_backward_lowering,
             inductor_config.fx_graph_cache, inductor_config.compile_threads,
             inductor_config.cpp.use_two_step_variance_threshold)
    GraphLowering.compile_to_module = schedule_only
    functorch_config.force_non_lazy_backward_lowering = True  # the backward is lowered with the forward
    inductor_config.fx_graph_cache = False
    inductor_config.compile_threads = 1  # nothing is compiled: no pool of compile workers to start
    inductor_config.cpp.use_two_step_variance_threshold = 0  # CUDA's Welford (see the docstring)
    try:
        with contextlib.suppress(_Counted):
            _region_step(torch.compile(forward, backend="inductor"), args)
    finally:
        (GraphLowering.compile_to_module, functorch_config.force_non_lazy_backward_lowering,
         inductor_config.fx_graph_cache, inductor_config.compile_threads,
         inductor_config.cpp.use_two_step_variance_threshold) = saved
        torch._logging.set_logs()
        quiet.__exit__(None, None, None)
    if len(kernels) != 2:
        raise RuntimeError(f"expected one forward and one backward graph, inductor lowered {len(kernels)}")
    if sum(graph_bytes) != metrics.num_bytes_accessed:
        raise RuntimeError(f"graph bytes {graph_bytes} do not sum to num_bytes_accessed {metrics.num_bytes_accessed}")
    return {"kernels": sum(kernels), "bytes": metrics.num_bytes_accessed, "forward": graph_bytes[0],
            "backward": graph_bytes[1]}


class _Counted(Exception):
    pass


def images_per_s(row: dict, compiled: bool, bandwidth: float = HBM_BYTES_PER_S) -> float:
    """The estimate for a card of achieved HBM `bandwidth` (bytes/s; default the H200's)."""
    device_s = row["mb_per_image"] * 1e6 * row["images_per_step"] / bandwidth + \
        row["gflop_per_image"] * 1e9 * row["images_per_step"] / MATMUL_FLOP_PER_S
    host_s = row["kernels"] * (COMPILED_LAUNCH_S if compiled else EAGER_LAUNCH_S)
    return row["images_per_step"] / max(device_s, host_s)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pe", nargs="+", default=["ape", "rope2d"], choices=["ape", "rope2d"])
    parser.add_argument("--k", nargs="+", type=int, default=[1, 8, 16])
    parser.add_argument("--compiled-k", nargs="+", type=int, default=[1, 8, 16],
                        help="the K whose compiled step is lowered (about two minutes each on 2 idle cores)")
    args = parser.parse_args(argv)
    F.scaled_dot_product_attention = fused_sdpa
    print("H200 and H100 estimates from one census of CPU counts; assumptions: achieved HBM bandwidth " +
          ", ".join(f"{card} {bw / 1e12:.1f} TB/s" for card, bw in CARDS.items()) +
          " (the H100's: 80% of its measured 3.0 TB/s copy), "
          f"{MATMUL_FLOP_PER_S / 1e12:.0f} TFLOP/s achieved bf16 matmul, {EAGER_LAUNCH_S * 1e6:.0f} us host time per "
          f"eager launch, {COMPILED_LAUNCH_S * 1e6:.0f} us per compiled kernel (both cards);")
    print("time per step = max(bytes / bandwidth + FLOPs / matmul rate, kernels x host cost). study_l, 32 px, "
          f"batch {BATCH} per member, bf16; compiled bytes: inductor's num_bytes_accessed (CPU fusion standing in "
          "for Triton's)")
    print(f"{'PE':7s} {'K':>3s}  {'variant':16s} {'kernels/step':>12s} {'MB/image':>9s} {'GFLOP/image':>11s} "
          + "".join(f" {card + ' img/s':>11s}" for card in CARDS))
    rows, t0 = {}, time.perf_counter()
    for pe in args.pe:
        for k in args.k:
            before = census(pe, k, before=True, compiled=False)["eager"]
            after = census(pe, k, before=False, compiled=k in args.compiled_k)
            for name, row, compiled in (("before (eager)", before, False), ("after (eager)", after["eager"], False),
                                        ("after (compiled)", after.get("compiled"), True)):
                if row is None:
                    print(f"{pe:7s} {k:3d}  {name:16s} {'(--compiled-k)':>12s}")
                    continue
                row["est_images_per_s"] = {card: images_per_s(row, compiled, bw) for card, bw in CARDS.items()}
                rows[(pe, k, name)] = row
                print(f"{pe:7s} {k:3d}  {name:16s} {row['kernels']:12,d} {row['mb_per_image']:9.1f} "
                      f"{row['gflop_per_image']:11.3f}" +
                      "".join(f" {row['est_images_per_s'][card]:11,.0f}" for card in CARDS), flush=True)
                if "parts_mb_per_image" in row:
                    print(" " * 30 + "MB/image: " + ", ".join(f"{part} {mb:.2f}"
                                                             for part, mb in row["parts_mb_per_image"].items()))
    if ("ape", 8, "after (compiled)") in rows:
        for card, got in rows[("ape", 8, "after (compiled)")]["est_images_per_s"].items():
            print(f"target: compiled K = 8 APE >= {TARGET:,} img/s (estimate, {card}): {got:,.0f} "
                  f"{'meets it' if got >= TARGET else 'short of it'}")
    print(f"({time.perf_counter() - t0:.0f} s on this machine; an estimate, not a measurement)")
    return rows


if __name__ == "__main__":
    main()
