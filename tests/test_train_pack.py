"""The training loop with K trials packed: every member ends as it would alone, resumes, and fails alone."""

import shutil

import pytest
import torch

import trainables.loop.train as loop
from trainables.loop import oom
from trainables.loop.checkpoints import SNAPSHOT_DIR, load, local_checkpoint
from trainables.loop.train import train, train_pack
from trainables.config.run_config import RunConfig


def member(seed, protocol="baseline", **fields):
    base = {"max_train_images": 256, "batch_size": 64, "epochs": 2, "warmup_epochs": 1, "lr": 1e-3, "pe": "ape"}
    return RunConfig.for_dataset("shapes", preset="tiny", seed=seed, protocol=protocol, **{**base, **fields})


MEMBERS = [
    member(0),
    member(1, "autoaugment+cutmix", rpt=True),
    member(2, "cutmix+label_smoothing", rpt=True, rpt_per_image=True),
]
QUIET = {"log": lambda *_: None}


def state(workdir):
    return load(local_checkpoint(workdir))


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    """The uninterrupted pack: (workdirs, finals, reports)."""
    root = tmp_path_factory.mktemp("pack")
    workdirs = [root / c.trial_id for c in MEMBERS]
    reports = []
    finals = train_pack(MEMBERS, workdirs, report=lambda ms: reports.extend((t, m["epoch"], d) for t, m, d in ms),
                        **QUIET)
    return workdirs, finals, reports


def test_each_member_ends_where_its_unpacked_run_ends(packed, tmp_path):
    workdirs, finals, reports = packed
    for cfg, workdir, final in zip(MEMBERS, workdirs, finals):
        alone = train(cfg, tmp_path / cfg.trial_id, **QUIET)
        assert final["error"] is None and final["epochs_completed"] == 2
        for ours, theirs in zip(final["history"], alone["history"]):
            assert ours["train_loss"] == pytest.approx(theirs["train_loss"], rel=1e-4)
            assert ours["eval_loss"] == pytest.approx(theirs["eval_loss"], rel=1e-4)
        mine, reference = state(workdir), state(tmp_path / cfg.trial_id)
        assert mine["config"] == reference["config"] and mine["epoch"] == reference["epoch"] == 2
        for name, value in reference["model"].items():
            assert (mine["model"][name] - value).abs().max() < 1e-4, (cfg.trial_id, name)
    # Records stay per trial: each member reported each epoch once, with its own checkpoint folder.
    assert sorted((t, e) for t, e, _ in reports) == sorted((c.trial_id, e) for c in MEMBERS for e in (1, 2))
    assert all(d.startswith(str(workdirs[[c.trial_id for c in MEMBERS].index(t)])) for t, _, d in reports)
    assert all(sorted(p.name for p in (w / SNAPSHOT_DIR).iterdir()) == ["epoch_0000.pt", "epoch_0001.pt",
                                                                       "epoch_0002.pt"] for w in workdirs)


class Killed(Exception):
    pass


def test_a_pack_killed_mid_epoch_resumes_to_the_uninterrupted_result(packed, tmp_path, monkeypatch):
    _, reference, _ = packed
    workdirs = [tmp_path / c.trial_id for c in MEMBERS]
    calls = {"n": 0}
    real = loop.random_permutation

    def crash_in_epoch_two(*args, **kwargs):  # 2 RPT members x 4 steps per epoch: call 11 is epoch 2, step 2
        calls["n"] += 1
        if calls["n"] == 11:
            raise Killed
        return real(*args, **kwargs)

    monkeypatch.setattr(loop, "random_permutation", crash_in_epoch_two)
    with pytest.raises(Killed):
        train_pack(MEMBERS, workdirs, **QUIET)
    assert [state(w)["epoch"] for w in workdirs] == [1, 1, 1]
    monkeypatch.setattr(loop, "random_permutation", real)

    seen = []
    resumed = train_pack(MEMBERS, workdirs, report=lambda ms: seen.extend((t, m["epoch"]) for t, m, _ in ms), **QUIET)
    assert sorted(seen) == sorted((c.trial_id, 2) for c in MEMBERS)  # each member finishes exactly once
    for ours, theirs in zip(resumed, reference):
        assert [h["epoch"] for h in ours["history"]] == [1, 2]
        for key in ("train_loss", "eval_loss", "eval_acc"):
            assert ours[key] == pytest.approx(theirs[key], abs=1e-5), key


def test_an_injected_divergence_fails_one_member_alone(packed, tmp_path, diverge):
    _, reference, _ = packed
    diverge(MEMBERS[1].trial_id, 2)
    finals = train_pack(MEMBERS, [tmp_path / c.trial_id for c in MEMBERS], **QUIET)
    assert "epoch 2" in finals[1]["error"] and finals[1]["epochs_completed"] == 1 and finals[1]["test_acc"] is None
    assert state(tmp_path / MEMBERS[1].trial_id)["epoch"] == 1  # its last good checkpoint stays
    for k in (0, 2):
        assert finals[k]["error"] is None and finals[k]["epochs_completed"] == 2
        assert finals[k]["eval_loss"] == pytest.approx(reference[k]["eval_loss"], abs=1e-6)


def test_members_must_share_their_resume_epoch(packed, tmp_path):
    workdirs = [tmp_path / c.trial_id for c in MEMBERS[:2]]
    local_checkpoint(workdirs[0]).parent.mkdir(parents=True)
    shutil.copy(local_checkpoint(packed[0][0]), local_checkpoint(workdirs[0]))
    with pytest.raises(ValueError, match="no checkpoint while the others do"):
        train_pack(MEMBERS[:2], workdirs, **QUIET)


def test_a_pack_out_of_gpu_memory_retries_in_halves(monkeypatch, tmp_path):
    tried = []

    def fake_train_pack(cfgs, workdirs, **kwargs):  # "GPU" that fits one member at a time
        tried.append(len(cfgs))
        if len(cfgs) > 1:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory")
        return [{"trial_id": cfgs[0].trial_id}]

    monkeypatch.setattr(loop, "train_pack", fake_train_pack)
    messages = []
    finals = oom.train_pack_fitting(MEMBERS, [tmp_path / c.trial_id for c in MEMBERS], log=messages.append)
    assert tried == [3, 1, 2, 1, 1] and [f["trial_id"] for f in finals] == [c.trial_id for c in MEMBERS]
    assert "--pack" in messages[0]
    monkeypatch.setattr(loop, "train_pack", lambda *a, **k: (_ for _ in ()).throw(torch.cuda.OutOfMemoryError("x")))
    with pytest.raises(RuntimeError, match="even alone at batch_size=64"):
        oom.train_pack_fitting(MEMBERS[:1], [tmp_path], log=messages.append)
    # cuBLAS / cuDNN report their allocation failures as plain RuntimeErrors
    for text in ("CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`",
                 "cuDNN error: CUDNN_STATUS_ALLOC_FAILED", "CUDA error: out of memory"):
        monkeypatch.setattr(loop, "train_pack", lambda *a, text=text, **k: (_ for _ in ()).throw(RuntimeError(text)))
        with pytest.raises(RuntimeError, match="even alone"):
            oom.train_pack_fitting(MEMBERS[:1], [tmp_path], log=messages.append)
    monkeypatch.setattr(loop, "train_pack", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("shape mismatch")))
    with pytest.raises(RuntimeError, match="^shape mismatch$"):  # anything else is not retried
        oom.train_pack_fitting(MEMBERS, [tmp_path / c.trial_id for c in MEMBERS], log=messages.append)


def test_the_oom_retry_starts_once_the_failed_attempt_is_gone(monkeypatch, tmp_path):
    """The retry in halves ran inside the `except` block: the traceback kept the failed attempt's
    model, optimiser and data alive on the device, so the halves had less memory than the whole."""
    import weakref

    members = [member(seed, epochs=1, warmup_epochs=0, max_train_images=128) for seed in range(3)]
    first_attempt = []
    real_step, real_train_pack = loop.pack_step, loop.train_pack

    def step(pack, *args, **kwargs):  # the pack of three "runs out of GPU memory" at its first step
        if pack.k == 3:
            first_attempt.append(weakref.ref(pack))
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return real_step(pack, *args, **kwargs)

    starts = []

    def train_pack(cfgs, *args, **kwargs):
        starts.append((len(cfgs), [ref() is None for ref in first_attempt]))
        return real_train_pack(cfgs, *args, **kwargs)

    monkeypatch.setattr(loop, "pack_step", step)
    monkeypatch.setattr(loop, "train_pack", train_pack)
    seen = []
    finals = oom.train_pack_fitting(members, [tmp_path / c.trial_id for c in members],
                                     report=lambda ms: seen.extend((t, m["epoch"]) for t, m, _ in ms), **QUIET)
    assert starts == [(3, []), (1, [True]), (2, [True])]  # the first pack was freed before each retry
    assert [f["error"] for f in finals] == [None] * 3 and all(f["epochs_completed"] == 1 for f in finals)
    assert sorted(seen) == sorted((c.trial_id, 1) for c in members)


def test_a_member_dropped_before_an_oom_does_not_rejoin_the_retry(monkeypatch, tmp_path, diverge):
    members = [member(seed, epochs=2, warmup_epochs=0, max_train_images=128) for seed in range(3)]
    diverge(members[1].trial_id, 1)
    real_evaluate = loop.evaluate_pack
    calls = {"n": 0}

    def evaluate(pack, *args, **kwargs):  # epoch 2 of the pack (member 1 gone) runs out of memory
        calls["n"] += 1
        if calls["n"] == 2:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory")
        return real_evaluate(pack, *args, **kwargs)

    monkeypatch.setattr(loop, "evaluate_pack", evaluate)
    dropped = []
    finals = oom.train_pack_fitting(members, [tmp_path / c.trial_id for c in members],
                                     dropped=lambda t, f: dropped.append((t, f["failed_epoch"])), **QUIET)
    assert dropped == [(members[1].trial_id, 1)]  # told once, at once; not trained again after the error
    assert "epoch 1" in finals[1]["error"] and finals[1]["epochs_completed"] == 0
    assert [finals[k]["epochs_completed"] for k in (0, 2)] == [2, 2] and finals[0]["error"] is None


def _graph(wrapped):
    """The compiled graph a compiled forward holds (``compiled.compile_forward``: the training step runs
    it, a forward without gradients the eager one)."""
    return dict(zip(wrapped.__code__.co_freevars, (c.cell_contents for c in wrapped.__closure__)))["graph"]


def test_compile_wraps_the_ddp_module_and_compiles_a_packs_vmapped_forward(monkeypatch, tmp_path):
    """Compiling the bare module after wrapping it in DDP replaced the DDP wrap: no gradient
    all-reduce, each rank trained on its own. A pack compiles its vmapped forward (no CUDA graphs:
    its inputs are the stacked leaves); the compile is CUDA-only and can be taken down again."""
    from trainables.model.fast_paths import wrap_forward
    from trainables.model.packed import PackedViT

    monkeypatch.setattr(torch.nn.parallel, "DistributedDataParallel", lambda m, device_ids=None: ("ddp", m))
    monkeypatch.setattr(torch, "compile", lambda m, mode=None, backend=None: ("compiled", mode, m))
    cfg = member(0, compile=True)
    pack = PackedViT([cfg], "cpu")
    wrap_forward(pack, cfg, torch.device("cuda"), world=2)
    assert _graph(pack.forward_module) == ("compiled", "reduce-overhead", ("ddp", pack.module))
    pack = PackedViT([cfg], "cpu")
    wrap_forward(pack, cfg, torch.device("cpu"), world=2)  # compiling on the CPU measured slower: off
    assert pack.forward_module == ("ddp", pack.module) and not pack.fast_paths.unproven
    pack = PackedViT([cfg, member(1, compile=True)], "cpu")
    eager = pack.forward_stacked
    wrap_forward(pack, cfg, torch.device("cuda"), world=1)
    assert _graph(pack.forward_stacked) == ("compiled", None, eager)
    [(name, fallback, take_down)] = pack.fast_paths.unproven
    take_down()
    assert pack.forward_stacked == eager and "torch.compile" in name and fallback == "the eager forward"
