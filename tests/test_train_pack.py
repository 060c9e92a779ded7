"""The training loop with K trials packed: every member ends as it would alone, resumes, and fails alone."""

import shutil

import pytest
import torch

import trainables.train as loop
from trainables.config import RunConfig
from trainables.train import CHECKPOINT_DIR, CHECKPOINT_FILE, DIVERGE_ENV, SNAPSHOT_DIR, train, train_pack


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
    return torch.load(workdir / CHECKPOINT_DIR / CHECKPOINT_FILE, weights_only=False)


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    """The uninterrupted pack: (workdirs, finals, reports)."""
    root = tmp_path_factory.mktemp("pack")
    workdirs = [root / c.trial_id for c in MEMBERS]
    reports = []
    finals = train_pack(MEMBERS, workdirs, report=lambda ms: reports.extend((t, m["epoch"], d) for t, m, d in ms), **QUIET)
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


def test_an_injected_divergence_fails_one_member_alone(packed, tmp_path, monkeypatch):
    _, reference, _ = packed
    monkeypatch.setenv(DIVERGE_ENV, f"{MEMBERS[1].trial_id}:2")
    finals = train_pack(MEMBERS, [tmp_path / c.trial_id for c in MEMBERS], **QUIET)
    assert "epoch 2" in finals[1]["error"] and finals[1]["epochs_completed"] == 1 and finals[1]["test_acc"] is None
    assert state(tmp_path / MEMBERS[1].trial_id)["epoch"] == 1  # its last good checkpoint stays
    for k in (0, 2):
        assert finals[k]["error"] is None and finals[k]["epochs_completed"] == 2
        assert finals[k]["eval_loss"] == pytest.approx(reference[k]["eval_loss"], abs=1e-6)


def test_members_must_share_their_resume_epoch(packed, tmp_path):
    workdirs = [tmp_path / c.trial_id for c in MEMBERS[:2]]
    (workdirs[0] / CHECKPOINT_DIR).mkdir(parents=True)
    shutil.copy(packed[0][0] / CHECKPOINT_DIR / CHECKPOINT_FILE, workdirs[0] / CHECKPOINT_DIR / CHECKPOINT_FILE)
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
    finals = loop.train_pack_fitting(MEMBERS, [tmp_path / c.trial_id for c in MEMBERS], log=messages.append)
    assert tried == [3, 1, 2, 1, 1] and [f["trial_id"] for f in finals] == [c.trial_id for c in MEMBERS]
    assert "--pack" in messages[0]
    monkeypatch.setattr(loop, "train_pack", lambda *a, **k: (_ for _ in ()).throw(torch.cuda.OutOfMemoryError("x")))
    with pytest.raises(RuntimeError, match="even alone at batch_size=64"):
        loop.train_pack_fitting(MEMBERS[:1], [tmp_path], log=messages.append)
