"""Checkpoints written and read the same way everywhere, correct for a GPU run on a CPU-only build.

The device half runs under torch's FakeTensorMode: tensors that claim device "cuda" on this
CPU build, so a device mistake (an RNG state moved to the GPU, a CUDA tensor saved) fails here
instead of on the first GPU run.
"""

import random

import pytest
import torch
from fake_cuda import fake_cuda

import trainables.loop.train as loop
from trainables.loop import checkpoints, optim
from trainables.loop.checkpoints import CorruptCheckpointError, load, local_checkpoint
from trainables.model.packed import PackedViT, init_member
from trainables.config.run_config import RunConfig

CUDA = torch.device("cuda")
QUIET = {"log": lambda *_: None}


def tiny(**fields):
    base = {"max_train_images": 128, "batch_size": 64, "epochs": 1, "warmup_epochs": 0, "pe": "ape"}
    return RunConfig.for_dataset("shapes", preset="tiny", **{**base, **fields})


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """(config, workdir) of a one-epoch run: a real checkpoint and snapshots."""
    cfg = tiny()
    workdir = tmp_path_factory.mktemp("ckpt")
    loop.train(cfg, workdir, **QUIET)
    return cfg, workdir


def tensors(obj):
    if torch.is_tensor(obj):
        yield obj
    elif isinstance(obj, dict):
        for v in obj.values():
            yield from tensors(v)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            yield from tensors(v)


def fresh(cfg, device, model=None):
    """A pack of one with its optimiser and scheduler. Under FakeTensorMode pass a real `model`
    made outside it: moving a real module to "cuda" inside gives fake CUDA parameters."""
    pack = PackedViT([cfg], device, models=None if model is None else [model])
    optimizer = pack.optimizer(optim.build_optimizer, cfg)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    return pack, optimizer, scheduler


def test_a_checkpoint_is_plain_data_read_without_running_code(trained, tmp_path):
    _, workdir = trained
    state = load(local_checkpoint(workdir))  # weights_only=True: every part is plain data
    assert {"model", "optimizer", "scheduler", "epoch", "torch_rng", "python_rng", "history", "config"} <= set(state)
    assert all(t.device.type == "cpu" for t in tensors(state))

    class Payload:
        def __reduce__(self):
            return (exec, ("import pathlib; pathlib.Path('pwned').touch()",))

    evil = tmp_path / "evil.pt"
    torch.save({"model": Payload()}, evil)
    with pytest.raises(CorruptCheckpointError, match="evil.pt is corrupt"):
        checkpoints.load_model(evil)
    assert not (tmp_path / "pwned").exists() and not (tmp_path.cwd() / "pwned").exists()


def test_restoring_for_a_cuda_run_loads_to_the_cpu(trained):
    """`map_location=device` put the saved CPU RNG state on the GPU, where torch.set_rng_state raises
    "RNG state must be a torch.ByteTensor": every GPU resume failed. Here the CPU build refuses the
    CUDA load outright, so the old policy fails too."""
    cfg, workdir = trained
    saved = load(local_checkpoint(workdir))
    pack, optimizer, scheduler = fresh(cfg, "cpu")
    torch.manual_seed(123)
    start, histories = checkpoints.restore_pack(pack, optimizer, scheduler, [local_checkpoint(workdir)], CUDA, **QUIET)
    assert start == 2 and [h["epoch"] for h in histories[0]] == [1]
    assert torch.equal(torch.get_rng_state(), saved["torch_rng"]) and random.getstate() == saved["python_rng"]


def test_each_part_of_a_loaded_checkpoint_moves_where_it_belongs_on_cuda(trained):
    cfg, workdir = trained
    states = [load(local_checkpoint(workdir))]  # read as the loop reads it, on the CPU
    model = init_member(cfg)
    with fake_cuda():  # FakeTensorMode, pinned copies stubbed (tests/fake_cuda.py)
        pack, optimizer, scheduler = fresh(cfg, CUDA, model)
        checkpoints.load_pack_state(pack, optimizer, scheduler, states, CUDA)
        slots = list(optimizer.state.values())
        assert slots and all(s["exp_avg"].device.type == "cuda" and s["exp_avg_sq"].device.type == "cuda"
                             for s in slots)
        # fused AdamW keeps `step` with the parameters (foreach would keep it on the CPU)
        assert all(s["step"].device.type == "cuda" for s in slots) and optimizer.param_groups[0]["fused"]
        assert all(p.device.type == "cuda" for p in pack.parameters())
    rng = torch.get_rng_state()
    assert rng.dtype == torch.uint8 and rng.device.type == "cpu" and torch.equal(rng, states[0]["torch_rng"])
    # The old policy, for the record: loading "to cuda" hands set_rng_state a device tensor.
    with fake_cuda():  # FakeTensorMode, pinned copies stubbed (tests/fake_cuda.py)
        on_device = torch.load(local_checkpoint(workdir), map_location=CUDA, weights_only=True)
        with pytest.raises(TypeError, match="RNG state must be a torch.ByteTensor"):
            torch.set_rng_state(on_device["torch_rng"])


def test_saved_checkpoints_and_snapshots_hold_cpu_tensors_only(trained, tmp_path, monkeypatch):
    cfg, workdir = trained
    written = []
    monkeypatch.setattr(torch, "save", lambda obj, path: written.append(obj) or open(path, "wb").close())
    model = init_member(cfg)
    with fake_cuda():  # FakeTensorMode, pinned copies stubbed (tests/fake_cuda.py)
        pack, optimizer, _ = fresh(cfg, CUDA, model)
        checkpoints.save_snapshot(pack.member_state_dict(0), cfg, 3, tmp_path)
        checkpoints.save({"model": pack.member_state_dict(0), "rng": [torch.zeros(4, dtype=torch.uint8)]},
                         tmp_path / checkpoints.CHECKPOINT_FILE)
    assert len(written) == 2 and all(next(tensors(w)) is not None for w in written)
    devices = {t.device.type for w in written for t in tensors(w)}
    assert devices == {"cpu"}, devices


def test_the_rng_state_of_the_device_in_use_restores_in_a_process_that_sees_one_device(monkeypatch):
    """Saved on a two-GPU machine by a run on cuda:1; resumed where one GPU is visible (a Ray worker):
    only the state of the device in use travels, and it lands on the device the resumed run uses."""
    generators = {0: torch.tensor([1, 2], dtype=torch.uint8), 1: torch.tensor([3, 4], dtype=torch.uint8)}

    def index(device):
        return torch.device(device).index or 0

    def set_state(state, device="cuda"):
        if index(device) >= len(generators):
            raise IndexError(f"device {index(device)} of {len(generators)}")
        generators[index(device)] = state.clone()

    monkeypatch.setattr(torch.cuda, "get_rng_state", lambda device="cuda": generators[index(device)].clone())
    monkeypatch.setattr(torch.cuda, "set_rng_state", set_state)
    state = checkpoints.rng_state(torch.device("cuda", 1))
    assert state["cuda_rng"].tolist() == [3, 4]
    assert "cuda_rng" not in checkpoints.rng_state(torch.device("cpu"))
    del generators[1]  # the resuming process sees one device
    generators[0] = torch.tensor([0, 0], dtype=torch.uint8)
    checkpoints.restore_rng(state, CUDA)
    assert list(generators) == [0] and generators[0].tolist() == [3, 4]
    checkpoints.restore_rng({**state, "cuda_rng": torch.tensor([9, 9], dtype=torch.uint8)}, torch.device("cpu"))
    assert generators[0].tolist() == [3, 4]  # a GPU checkpoint resumed on a CPU machine leaves the GPU alone


def test_snapshot_names_and_the_train_storage_of_earlier_versions():
    assert checkpoints.snapshot_name(4) == "epoch_0004.pt" and checkpoints.snapshot_epoch("s3://b/x/epoch_0004.pt") == 4
    assert checkpoints.snapshot_epoch("epoch_0004.pt.tmp") is None
    dirs = ["/s/train/t/checkpoint_2026-01-02_10-00-00.000001", "/s/train/t/checkpoint_2026-01-02_09-59-59.9",
            "/s/train/t/other"]
    assert checkpoints.latest_train_checkpoint(dirs) == dirs[0]
    assert checkpoints.latest_train_checkpoint(["/s/train/t/other"]) is None
