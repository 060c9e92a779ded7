"""Packed trials: K ViTs stacked under vmap train exactly as K plain-module runs would."""

import copy
import dataclasses

import pytest
import torch
import torch.nn.functional as F

from reference import cutmix_batch

from trainables.data.protocols import soft_targets
from trainables.loop.checkpoints import SNAPSHOT_DIR, load
from trainables.loop.optim import build_optimizer, lr_factor
from trainables.loop.train import random_permutation, train
from trainables.model import folded
from trainables.model.packed import PackedViT, init_member
from trainables.model.pos_embed import POS_EMBEDS
from trainables.config.run_config import RunConfig
from trainables.config.pack_keys import PACK_FREE_FIELDS, pack_blocker, pack_key

STEPS, BATCH = 20, 16


def member_model(pack: PackedViT, k: int) -> torch.nn.Module:
    """A plain ViT holding member k's weights, in the mode the pack is in."""
    model = copy.deepcopy(pack.template)
    model.load_state_dict(pack.member_state_dict(k))
    return model.train(pack.training)


def member(seed, protocol="baseline", **fields):
    base = {"lr": 1e-3, "epochs": 2, "warmup_epochs": 1, "batch_size": BATCH, "pe": "rope2d_mixed"}
    return RunConfig.for_dataset("shapes", preset="tiny", seed=seed, protocol=protocol, **{**base, **fields})


# Different seeds, protocols (CutMix soft targets, label smoothing) and RPT modes (none, per batch, per image).
MEMBERS = [
    member(0),
    member(1, "cutmix+label_smoothing", rpt=True),
    member(2, "autoaugment+label_smoothing", rpt=True, rpt_per_image=True),
]


def fixed_batches(cfg, steps=STEPS):
    """(x, soft targets, perm) per step, drawn from the member's seed; the input path is not under test."""
    g = torch.Generator().manual_seed(100 + cfg.seed)
    batches = []
    for _ in range(steps):
        x = torch.randn(BATCH, 3, 32, 32, generator=g)
        targets = soft_targets(torch.randint(0, 10, (BATCH,), generator=g), 10)
        if cfg.cutmix:
            x, targets = cutmix_batch(x, targets, generator=g)
        perm = None
        if cfg.rpt:
            perm = random_permutation(BATCH, cfg.model.num_patches, per_image=cfg.rpt_per_image, generator=g)
        batches.append((x, targets, perm))
    return batches


def schedule(optimizer, steps=STEPS):
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: lr_factor(s, warmup_steps=5, total_steps=steps, schedule="cosine")
    )


def train_alone(cfg, batches):
    """The plain-module step of trainables.loop.train, on fixed batches."""
    model = init_member(cfg).train()
    optimizer = build_optimizer(model, cfg)
    scheduler = schedule(optimizer)
    losses = []
    for x, targets, perm in batches:
        loss = F.cross_entropy(model(x, perm=perm).logits.float(), targets, label_smoothing=cfg.protocol.smoothing)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        scheduler.step()
        losses.append(loss.item())
    return model, optimizer, losses


def packed_step(pack, optimizer, scheduler, step_batches):
    x = torch.stack([b[0] for b in step_batches])
    targets = torch.stack([b[1] for b in step_batches])
    losses = pack.losses(pack(x, [b[2] for b in step_batches]), targets)
    optimizer.zero_grad(set_to_none=True)
    losses.sum().backward()
    optimizer.step()
    scheduler.step()
    return losses.detach()


def test_a_pack_trains_each_member_as_the_plain_loop_does():
    batches = [fixed_batches(c) for c in MEMBERS]
    alone = [train_alone(c, b) for c, b in zip(MEMBERS, batches)]

    pack = PackedViT(MEMBERS).train()
    optimizer = pack.optimizer(build_optimizer)
    scheduler = schedule(optimizer)
    packed_losses = torch.stack([packed_step(pack, optimizer, scheduler, step) for step in zip(*batches)])  # (S, K)

    for k, (model, plain_optimizer, losses) in enumerate(alone):
        assert packed_losses[:, k].tolist() == pytest.approx(losses, rel=1e-4), k
        ours = pack.member_state_dict(k)
        assert ours.keys() == model.state_dict().keys()
        for name, value in model.state_dict().items():
            assert (ours[name] - value).abs().max() < 1e-4, (k, name)
        # Optimiser state per member has the unpacked layout (a trial resumes packed or unpacked).
        theirs = plain_optimizer.state_dict()
        mine = pack.member_optimizer_state(optimizer, k)
        assert mine["param_groups"] == theirs["param_groups"]
        for i, slot in theirs["state"].items():
            assert float(mine["state"][i]["step"]) == float(slot["step"]) == STEPS
            assert torch.allclose(mine["state"][i]["exp_avg"], slot["exp_avg"], atol=1e-6)
    # Members really differ: different seeds, smoothing and permutations give different losses.
    assert len({round(v, 4) for v in packed_losses[0].tolist()}) == 3


def test_a_pack_of_one_is_the_plain_loop_bit_for_bit():
    cfg = MEMBERS[1]
    batches = fixed_batches(cfg, 4)
    _, _, losses = train_alone(cfg, batches)
    pack = PackedViT([cfg]).train()
    assert not pack.stacked and isinstance(pack.module, torch.nn.Module)
    optimizer = pack.optimizer(build_optimizer)
    scheduler = schedule(optimizer)
    assert [packed_step(pack, optimizer, scheduler, [b]).item() for b in batches] == losses


def test_decay_groups_come_from_build_optimizer_on_the_unstacked_model():
    pack = PackedViT(MEMBERS[:2])
    optimizer = pack.optimizer(build_optimizer)
    decay, no_decay = ([id(p) for p in g["params"]] for g in optimizer.param_groups)
    assert optimizer.param_groups[0]["weight_decay"] == 0.05 and optimizer.param_groups[1]["weight_decay"] == 0.0
    by_name = {name: id(p) for name, p in pack.params.items()}
    assert pack.params["blocks.0.attn.qkv.bias"].ndim == 2  # stacked: ndim alone would decay it
    for name in ("blocks.0.attn.qkv.bias", "norm.weight", "cls_token", "pe.freqs"):
        assert by_name[name] in no_decay, name
    assert by_name["blocks.0.attn.qkv.weight"] in decay


@pytest.mark.parametrize("pe", sorted(POS_EMBEDS))
def test_packed_forward_equals_each_model_for_every_pe(pe):
    cfgs = [member(0, pe=pe), member(5, pe=pe, rpt=True)]
    pack = PackedViT(cfgs)
    models = [init_member(c) for c in cfgs]
    x = torch.randn(2, 4, 3, 32, 32)
    perms = [None, torch.randperm(64)]
    with torch.no_grad():
        out = pack(x, perms)
        ref = torch.stack([m(x[k], perm=perms[k]).logits for k, m in enumerate(models)])
        assert out.shape == (2, 4, 10)
        assert torch.allclose(out, ref, atol=1e-5)
        shared = pack.eval()(x[0])  # evaluation: one batch for every member
        assert torch.allclose(shared, torch.stack([m.eval()(x[0]).logits for m in models]), atol=1e-5)


@pytest.mark.parametrize("pe", sorted(POS_EMBEDS))
def test_folded_linear_layers_train_as_the_unfolded_pack_for_every_pe(pe, monkeypatch):
    """The packed Linear layers with their biases and LayerNorms folded into one matmul each
    (`trainables.model.folded`) give the unfolded pack's losses over two steps and its first gradients
    (fp32), on the ViT's parameters: the fold is a computation, not a layout."""
    cfgs = [member(0, pe=pe), member(1, "cutmix+label_smoothing", pe=pe, rpt=True, rpt_per_image=True)]
    batches = list(zip(*(fixed_batches(c, 2) for c in cfgs)))

    def two_steps():
        pack = PackedViT(cfgs).train()
        optimizer = pack.optimizer(build_optimizer)
        scheduler = schedule(optimizer, 2)
        losses = packed_step(pack, optimizer, scheduler, batches[0])
        grads = {name: p.grad.clone() for name, p in pack.params.items()}
        return pack, torch.stack([losses, packed_step(pack, optimizer, scheduler, batches[1])]), grads

    pack, losses, grads = two_steps()
    folds = [m for m in pack.base.modules() if isinstance(m, folded.FoldedLinear)]
    assert len(folds) == 3 * cfgs[0].model.depth  # qkv, fc1, fc2
    assert pack.member_state_dict(1).keys() == init_member(cfgs[1]).state_dict().keys()
    monkeypatch.setattr(folded, "fold_linears", lambda base: [])
    unfolded, expected_losses, expected_grads = two_steps()
    assert not any(isinstance(m, folded.FoldedLinear) for m in unfolded.base.modules())
    assert torch.allclose(losses, expected_losses, rtol=0, atol=1e-6), (losses, expected_losses)
    assert grads.keys() == expected_grads.keys()
    for name, grad in grads.items():
        assert torch.allclose(grad, expected_grads[name], rtol=1e-4, atol=1e-6), name


def test_members_start_from_the_weights_of_their_unpacked_runs(tmp_path):
    cfg = RunConfig.for_dataset("shapes", preset="tiny", seed=3, epochs=1, warmup_epochs=0, batch_size=64,
                                max_train_images=64, pe="rope2d_mixed")
    train(cfg, tmp_path, log=lambda *_: None)
    start = load(tmp_path / SNAPSHOT_DIR / "epoch_0000.pt")["model"]  # fp16
    pack = PackedViT([dataclasses.replace(cfg, seed=4), cfg])  # its place in the pack does not matter
    ours, other = pack.member_state_dict(1), pack.member_state_dict(0)
    for name, value in start.items():
        assert torch.allclose(ours[name].half().float(), value.float(), atol=1e-3), name
    assert not torch.allclose(other["head.weight"], ours["head.weight"])


def test_a_member_resumes_unpacked_and_packed_where_the_pack_left_it():
    batches = [fixed_batches(c, 8) for c in MEMBERS]
    pack = PackedViT(MEMBERS).train()
    optimizer = pack.optimizer(build_optimizer)
    scheduler = schedule(optimizer)
    for step in list(zip(*batches))[:5]:
        packed_step(pack, optimizer, scheduler, step)
    saved = [(pack.member_state_dict(k), pack.member_optimizer_state(optimizer, k)) for k in range(3)]
    sched_state = scheduler.state_dict()
    for step in list(zip(*batches))[5:]:
        packed_step(pack, optimizer, scheduler, step)

    # Unpacked: member 2's checkpoint loads into a plain ViT and its optimiser.
    cfg = MEMBERS[2]
    model = init_member(cfg).train()
    model.load_state_dict(saved[2][0])
    plain = build_optimizer(model, cfg)
    plain_scheduler = schedule(plain)  # order as in train(): scheduler, then optimiser state, then its state
    plain.load_state_dict(copy.deepcopy(saved[2][1]))  # torch keeps the `step` tensor and bumps it in place
    plain_scheduler.load_state_dict(sched_state)
    for x, targets, perm in batches[2][5:]:
        loss = F.cross_entropy(model(x, perm=perm).logits.float(), targets, label_smoothing=cfg.protocol.smoothing)
        plain.zero_grad()
        loss.backward()
        plain.step()
        plain_scheduler.step()
    for name, value in model.state_dict().items():
        assert (pack.member_state_dict(2)[name] - value).abs().max() < 1e-5, name

    # Packed again, in another order: members 2 and 0 form a fresh pack from their checkpoints.
    again = PackedViT([MEMBERS[2], MEMBERS[0]]).train()
    again_optimizer = again.optimizer(build_optimizer)
    again_scheduler = schedule(again_optimizer)
    for k, old in enumerate((2, 0)):
        again.load_member_state_dict(k, saved[old][0])
        again.load_member_optimizer_state(again_optimizer, k, saved[old][1])
    again_scheduler.load_state_dict(sched_state)
    for b2, b0 in zip(batches[2][5:], batches[0][5:]):
        packed_step(again, again_optimizer, again_scheduler, (b2, b0))
    for k, old in enumerate((2, 0)):
        for name, value in again.member_state_dict(k).items():
            assert (pack.member_state_dict(old)[name] - value).abs().max() < 1e-5, (old, name)


def test_a_diverged_member_is_dropped_and_the_others_go_on():
    batches = [fixed_batches(c, 6) for c in MEMBERS]
    runs = {}
    for poisoned in (False, True):
        pack = PackedViT(MEMBERS).train()
        optimizer = pack.optimizer(build_optimizer)
        scheduler = schedule(optimizer)
        if poisoned:
            with torch.no_grad():
                pack.params["head.weight"][1] = float("inf")  # member 1 diverges
        steps = list(zip(*batches))
        sums = torch.zeros(3, dtype=torch.float64)
        for step in steps[:3]:
            sums += packed_step(pack, optimizer, scheduler, step)
        failed = [k for k in range(3) if not torch.isfinite(sums[k])]  # checked once per "epoch"
        assert failed == ([1] if poisoned else [])
        keep = pack.drop(optimizer, [1])
        assert keep == [0, 2] and pack.k == 2 and pack.trial_ids == [MEMBERS[0].trial_id, MEMBERS[2].trial_id]
        assert all(optimizer.state[p]["exp_avg"].shape[0] == 2 for p in pack.parameters())
        for step in steps[3:]:
            losses = packed_step(pack, optimizer, scheduler, [step[0], step[2]])
            assert torch.isfinite(losses).all()
        runs[poisoned] = [pack.member_state_dict(k) for k in range(2)]
    for clean, survivor in zip(runs[False], runs[True]):
        for name in clean:
            assert torch.allclose(clean[name], survivor[name], atol=1e-6), name


def test_pack_key_ignores_only_the_free_fields():
    a = member(0)
    assert "cutmix_prob" in PACK_FREE_FIELDS
    assert pack_key(a) == pack_key(member(7, "autoaugment+cutmix+label_smoothing", rpt=True, rpt_per_image=True))
    assert pack_key(a) != pack_key(member(0, lr=5e-4))
    assert pack_key(a) != pack_key(member(0, pe="ape"))
    with pytest.raises(ValueError, match=r"differ in \['lr'\]"):
        PackedViT([a, member(1, lr=5e-4)])
    assert pack_blocker(a) is None
    study_p = RunConfig.for_dataset("imagenet100", preset="study_p", data_root="/nonexistent")
    assert "drop_path_rate=0.2" in pack_blocker(study_p)
    with pytest.raises(ValueError, match="cannot be packed"):
        PackedViT([study_p, dataclasses.replace(study_p, seed=1)])


# -- precision and attention under vmap ------------------------------------------------------------


def _saved_bytes(fn) -> tuple[torch.Tensor, dict[torch.dtype, int]]:
    """fn()'s output and the bytes (per dtype) of the tensors autograd saves for its backward."""
    total: dict[torch.dtype, int] = {}

    def pack_hook(t):
        total[t.dtype] = total.get(t.dtype, 0) + t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack_hook, lambda t: t):
        out = fn()
    return out, total


def test_packed_forward_under_autocast_is_bf16_like_the_plain_module():
    """vmap hides Linear from autocast; with fp32 biases the add would promote every Linear output
    to fp32. The pack folds the Linear parameters into bf16 weights (`trainables.model.folded`), so
    logits and the bf16 activations saved for backward are the plain module's (with the same
    explicit attention, the CPU's; the folded inputs' columns of ones are within the margin), while
    the optimiser's leaves and their gradients stay fp32. (The packed LayerNorm keeps the
    normalised fp32 tokens, and its patch-embedding convolution runs in fp32: the fp32 part is ~2x
    the plain module's, a small share of the total.)"""
    cfgs = [member(0, pe="ape"), member(1, pe="ape")]
    pack = PackedViT(cfgs).train()
    plain = init_member(cfgs[0]).train()
    x = torch.randn(2, 32, 3, 32, 32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        packed, packed_bytes = _saved_bytes(lambda: pack(x))
        alone, alone_bytes = _saved_bytes(lambda: plain(x[0], explicit_attention=True).logits)
    assert alone.dtype == packed.dtype == torch.bfloat16
    bf16, fp32 = alone_bytes[torch.bfloat16], alone_bytes[torch.float32]
    assert abs(packed_bytes[torch.bfloat16] / 2 - bf16) <= 0.05 * bf16, (packed_bytes, alone_bytes)
    assert packed_bytes[torch.float32] / 2 <= 2.5 * fp32, (packed_bytes, alone_bytes)  # + the fp32 conv input
    pack.losses(packed, soft_targets(torch.zeros(2, 32, dtype=torch.long), 10).view(2, 32, 10)).sum().backward()
    assert all(p.dtype == torch.float32 and p.grad.dtype == torch.float32 for p in pack.parameters())
    with torch.no_grad():  # outside autocast nothing changes: fp32 logits
        assert pack(x).dtype == torch.float32


def test_attention_selector_picks_fused_on_cuda_and_explicit_on_the_cpu():
    from trainables.model.packed import fused_attention_under_vmap

    assert fused_attention_under_vmap("cuda") and fused_attention_under_vmap(torch.device("cuda", 1))
    assert not fused_attention_under_vmap("cpu")
    # The fused kernel run per member without vmap equals the vmapped explicit path (what CUDA's
    # batched fused kernels compute per member) to float tolerance.
    cfgs = [member(0, pe="rope2d"), member(3, pe="rope2d", rpt=True)]
    pack = PackedViT(cfgs)
    x = torch.randn(2, 8, 3, 32, 32)
    perms = [None, torch.randperm(64)]
    with torch.no_grad():
        explicit = pack(x, perms)
        fused = torch.stack([member_model(pack, k)(x[k], perm=perms[k]).logits for k in range(2)])
    assert torch.allclose(explicit, fused, atol=1e-5)


def test_evaluation_under_autocast_is_within_a_fifth_of_a_point_of_fp32():
    """`evaluate_pack` runs the forward under the step's bf16 autocast. On a test model (random
    ViT features, least-squares head; noisy class templates, ~97% accuracy) its top-1 stays
    within 0.2 points of the fp32 evaluation for every member (CPU bf16 autocast here)."""
    from trainables.data.images import normalize
    from trainables.loop.train import evaluate_pack

    g = torch.Generator().manual_seed(0)
    templates = torch.rand(10, 3, 4, 4, generator=g).repeat_interleave(8, -1).repeat_interleave(8, -2) * 255
    labels = torch.arange(2000) % 10
    images = (templates[labels] + 70 * torch.randn(2000, 3, 32, 32, generator=g)).clamp(0, 255).to(torch.uint8)
    mean, std = (0.5,) * 3, (0.25,) * 3
    models = []
    for cfg in (member(0), member(1)):
        model = init_member(cfg).eval()
        with torch.no_grad():
            for module in model.modules():  # spread-out features (timm's 0.02 init makes CLS tokens near-equal)
                if isinstance(module, torch.nn.Linear):
                    module.weight.normal_(0, module.in_features**-0.5, generator=g)
            model.cls_token.normal_(generator=g)
            features = []
            hook = model.head.register_forward_hook(
                lambda m, inputs, out, features=features: features.append(inputs[0]))
            model(normalize(images, mean, std))
            hook.remove()
            f = torch.cat([features[0], torch.ones(len(images), 1)], 1)
            w = torch.linalg.solve(f.T @ f + 30 * torch.eye(f.shape[1]), f.T @ (10 * F.one_hot(labels, 10).float()))
            model.head.weight.copy_(w[:-1].T)
            model.head.bias.copy_(w[-1])
        models.append(model)
    pack = PackedViT([member(0), member(1)], models=models)
    batches = list(zip(images.split(500), labels.split(500)))
    fp32 = evaluate_pack(pack, batches, mean, std, torch.device("cpu"), use_amp=False)
    seen = []
    forward = pack.forward
    pack.forward = lambda *a, **kw: seen.append(forward(*a, **kw).dtype) or forward(*a, **kw)
    bf16 = evaluate_pack(pack, batches, mean, std, torch.device("cpu"), use_amp=True)
    assert seen and all(dtype == torch.bfloat16 for dtype in seen)  # the forward ran under autocast
    for (_, acc32), (_, acc16) in zip(fp32, bf16):
        assert 0.6 < acc32 < 0.995 and abs(acc16 - acc32) <= 0.002 + 1e-9, (fp32, bf16)
