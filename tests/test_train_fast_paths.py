"""The step's fast paths, executed before the first GPU: the fused attention under vmap and the
compiled packed forward, each against the eager explicit path over two training steps on the CPU,
and each falling back with one logged line when its first step fails (failures injected here)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from trainables.loop import optim, train
from trainables.model import packed
from trainables.model.compiled import compile_forward
from trainables.model.packed import PackedViT
from trainables.model.pos_embed import POS_EMBEDS
from trainables.config.run_config import RunConfig

BATCH = 8
ROOT = Path(__file__).resolve().parents[1]


def member(seed: int, **fields) -> RunConfig:
    base = {"lr": 1e-3, "epochs": 2, "warmup_epochs": 1, "batch_size": BATCH}
    return RunConfig.for_dataset("shapes", preset="tiny", seed=seed, **{**base, **fields})


def members(pe: str = "rope2d_mixed") -> list[RunConfig]:
    # CutMix + label smoothing on one, RPT per image on the other: every per-member input of the step
    return [member(0, pe=pe, protocol="cutmix+label_smoothing"), member(1, pe=pe, rpt=True, rpt_per_image=True)]


def batches(cfgs: list[RunConfig], step: int):
    g = torch.Generator().manual_seed(step)
    return [(torch.randint(0, 256, (BATCH, 3, 32, 32), dtype=torch.uint8, generator=g),
             torch.randint(0, 10, (BATCH,), generator=g)) for _ in cfgs]


def two_steps(pack: PackedViT, cfgs: list[RunConfig]) -> tuple[list[torch.Tensor], dict[str, torch.Tensor]]:
    """Two `train.pack_step`s (forward, backward, AdamW) on fixed batches: (losses per step, the first
    step's gradients); the second step's losses are those of the weights the first step made."""
    optimizer = pack.optimizer(optim.build_optimizer, cfgs[0])
    pack.train()
    mix = [torch.Generator().manual_seed(train.epoch_seed(c.seed, 1, 2)) for c in cfgs]
    perm = [torch.Generator().manual_seed(train.epoch_seed(c.seed, 1, 3)) for c in cfgs]
    losses, grads = [], {}
    for step in range(2):
        loss, _ = train.pack_step(pack, optimizer, cfgs, batches(cfgs, step), num_classes=10, mean=(0.5,) * 3,
                                  std=(0.25,) * 3, mix_gens=mix, perm_gens=perm, use_amp=False)
        losses.append(loss)
        grads = grads or {name: p.grad.clone() for name, p in pack.params.items()}
    return losses, grads


def assert_same_training(a, b, atol: float = 1e-5) -> None:
    """Losses and first gradients agree. (Not later gradients or the weights to `atol`: AdamW turns a
    gradient that is float noise in both, such as the key bias's, which softmax ignores, into a step
    of +-lr either way.)"""
    (losses_a, grads_a), (losses_b, grads_b) = a, b
    for la, lb in zip(losses_a, losses_b):
        assert torch.allclose(la, lb, atol=atol), (la, lb)
    for name in grads_a:
        assert torch.allclose(grads_a[name], grads_b[name], atol=atol), name


@pytest.mark.filterwarnings("ignore::UserWarning")  # vmap's "no batching rule" performance warning on the CPU
@pytest.mark.parametrize("pe", sorted(POS_EMBEDS))
def test_the_fused_attention_under_vmap_trains_as_the_explicit_path_for_every_pe(pe, monkeypatch):
    """On the CPU the pack takes the explicit path; forced onto the fused SDPA call (vmap runs it
    through its fallback, not CUDA's kernels), two steps give the same losses and weights."""
    cfgs = members(pe)
    explicit = PackedViT(cfgs)
    assert explicit.explicit_attention
    expected = two_steps(explicit, cfgs)
    calls = []
    sdpa = F.scaled_dot_product_attention
    monkeypatch.setattr(F, "scaled_dot_product_attention", lambda *a, **kw: calls.append(1) or sdpa(*a, **kw))
    monkeypatch.setattr(packed, "fused_attention_under_vmap", lambda device: True)
    fused = PackedViT(cfgs)
    assert not fused.explicit_attention
    assert_same_training(two_steps(fused, cfgs), expected)
    assert calls and not fused.fast_paths.unproven  # the fused call ran, and the first step proved it


def test_a_fused_attention_that_fails_on_the_first_step_falls_back_with_one_line(monkeypatch):
    cfgs = members("rope2d")
    expected = two_steps(PackedViT(cfgs), cfgs)

    def no_kernel(*args, **kwargs):  # what a missing backend / batching rule raises on the device
        raise RuntimeError("No available kernel. Aborting execution.\nmore detail")

    monkeypatch.setattr(F, "scaled_dot_product_attention", no_kernel)
    monkeypatch.setattr(packed, "fused_attention_under_vmap", lambda device: True)
    lines = []
    pack = PackedViT(cfgs, log=lines.append)
    assert_same_training(two_steps(pack, cfgs), expected)
    assert pack.explicit_attention and len(lines) == 1, lines
    assert lines[0].startswith("the fused attention under vmap failed on the first step (RuntimeError: No available "
                               "kernel. Aborting execution.); the explicit softmax attention from now on"), lines


def test_out_of_memory_is_no_fast_paths_fault(monkeypatch):
    monkeypatch.setattr(packed, "fused_attention_under_vmap", lambda device: True)
    monkeypatch.setattr(F, "scaled_dot_product_attention",
                        lambda *a, **kw: (_ for _ in ()).throw(RuntimeError("CUDA out of memory. Tried to allocate")))
    cfgs = members("ape")
    pack = PackedViT(cfgs, log=pytest.fail)
    with pytest.raises(RuntimeError, match="out of memory"):
        two_steps(pack, cfgs)
    assert not pack.explicit_attention  # left for train_pack_fitting's retry in halves


def _backend() -> str:
    """Inductor where the CPU toolchain allows (a C++ compiler), aot_eager otherwise."""
    return "inductor" if shutil.which("g++") or shutil.which("clang++") else "aot_eager"


def test_dynamo_captures_the_vmapped_packed_forward_as_one_graph():
    cfgs = members("rope2d_mixed")
    pack = PackedViT(cfgs).train()
    x = torch.randn(2, BATCH, 3, 32, 32)
    perm = torch.stack([torch.arange(64).expand(BATCH, 64), torch.rand(BATCH, 64).argsort(1)])
    explained = torch._dynamo.explain(pack.forward_stacked)(pack.params, pack.buffers, x, perm, True)
    assert explained.graph_count == 1 and explained.graph_break_count == 0, explained.break_reasons


def test_a_compiled_pack_of_two_trains_as_the_eager_pack():
    torch._dynamo.reset()
    cfgs = members("rope2d_mixed")
    expected = two_steps(PackedViT(cfgs), cfgs)
    lines = []
    pack = PackedViT(cfgs, log=lines.append)
    compile_forward(pack, backend=_backend())
    got = two_steps(pack, cfgs)
    assert not lines and not pack.fast_paths.unproven  # compiled, not fallen back
    assert_same_training(got, expected, atol=1e-4)


def _eval_batches():
    """Two full batches and a partial one (the last batch of an evaluation split)."""
    g = torch.Generator().manual_seed(7)
    return [(torch.randint(0, 256, (n, 3, 32, 32), dtype=torch.uint8, generator=g),
             torch.randint(0, 10, (n,), generator=g)) for n in (BATCH, BATCH, 3)]


@pytest.mark.parametrize("k", [1, 2])
def test_evaluating_a_compiled_pack_compiles_no_graph_of_its_own(k):
    """Training compiles one graph; `evaluate_pack` (no grad, a partial batch) runs the eager forward:
    no second graph per trial, and the same numbers as the eager pack's evaluation."""
    from torch._dynamo.testing import CompileCounterWithBackend

    torch._dynamo.reset()
    cfgs = members("ape")[:k]
    eager = PackedViT(cfgs)
    two_steps(eager, cfgs)
    expected = train.evaluate_pack(eager, _eval_batches(), (0.5,) * 3, (0.25,) * 3, torch.device("cpu"))
    counter = CompileCounterWithBackend("aot_eager")
    pack = PackedViT(cfgs, log=pytest.fail)
    compile_forward(pack, backend=counter)
    two_steps(pack, cfgs)
    assert counter.frame_count == 1 and not pack.fast_paths.unproven
    got = train.evaluate_pack(pack, _eval_batches(), (0.5,) * 3, (0.25,) * 3, torch.device("cpu"))
    assert counter.frame_count == 1  # after the evaluation too
    for (loss, acc), (loss_e, acc_e) in zip(got, expected):
        assert loss == pytest.approx(loss_e, abs=1e-4) and acc == acc_e


def test_a_compile_that_fails_on_the_first_step_falls_back_to_eager_with_one_line(monkeypatch):
    cfgs = members("ape")
    expected = two_steps(PackedViT(cfgs), cfgs)

    def broken(fn, **kwargs):  # torch.compile compiles at the first call: that is where it fails
        def call(*args, **kw):
            raise RuntimeError("backend='inductor' raised: CppCompileError: C++ compile error")
        return call

    monkeypatch.setattr(torch, "compile", broken)
    lines = []
    pack = PackedViT(cfgs, log=lines.append)
    compile_forward(pack)
    assert_same_training(two_steps(pack, cfgs), expected)
    assert len(lines) == 1 and lines[0].startswith("torch.compile (inductor) failed on the first step "
                                                   "(RuntimeError: backend='inductor' raised"), lines
    assert lines[0].endswith("; the eager forward from now on")



def test_an_eager_training_run_never_imports_the_compiler(tmp_path):
    """A real `train_pack` with compile off, in a fresh process (other tests' imports would leak):
    neither `trainables.model.compiled` nor inductor's compiler (its lowering, code generation and CUDA
    graph trees) is loaded. (`torch._inductor` itself and its config are: torchvision, through timm,
    imports them at import time.)"""
    code = textwrap.dedent(f"""
        import sys
        from trainables.config.run_config import RunConfig
        from trainables.loop.train import train_pack
        cfgs = [RunConfig.for_dataset("shapes", preset="tiny", seed=seed, max_train_images=64, batch_size=32,
                                      epochs=1, warmup_epochs=1, lr=1e-3) for seed in (0, 1)]
        finals = train_pack(cfgs, [{str(tmp_path)!r} + "/" + c.trial_id for c in cfgs], log=lambda *_: None)
        assert [f["epochs_completed"] for f in finals] == [1, 1], finals
        compiler = ("trainables.model.compiled", "torch._inductor.compile_fx", "torch._inductor.graph",
                    "torch._inductor.codegen", "torch._inductor.cudagraph_trees")
        print(sorted(m for m in compiler if m in sys.modules))
    """)
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1] == "[]", done.stdout
