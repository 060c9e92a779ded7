"""--dry-run's GPU-hours: from a measured throughput table, and said so when there is none."""

from __future__ import annotations

from pathlib import Path

from conftest import load_script

from sweeps import run as launcher
from sweeps.launch import estimate, options
from sweeps.launch.packs import Pack

ROOT = Path(__file__).resolve().parent.parent


def _plan(*argv):
    parser = launcher.argparse.ArgumentParser()
    options.add_arguments(parser)
    args = parser.parse_args([*argv, "--dry-run"])
    configs = options.build_trials(args)
    return configs, options.build_packs(args, configs)


def test_gpu_hours_from_the_measured_rate_of_each_pack_size():
    configs, packs = _plan("study_l", "--datasets", "cifar10", "--seeds", "5", "--gpus-per-trial", "1", "--pack", "8")
    rates = {1: 20_000.0, 4: 60_000.0, 8: 100_000.0}
    table = {"device": "H200", "measured_at": "2026-12-01",
             "packing": {"study_l": {f"K={k}": {"images_per_s": r} for k, r in rates.items()}}}
    per_trial = 47_500 * 100  # CIFAR-10's train split less the 5% holdout, x 100 epochs
    # A pack of K is timed at the largest measured size <= K (conservative, never extrapolated).
    expected = sum(len(p.members) * per_trial / rates[max(k for k in rates if k <= len(p.members))] for p in packs)
    assert len({len(p.members) for p in packs}) > 1  # the grid leaves packs of several sizes
    assert estimate.estimate(configs, packs, table).startswith(f"GPU-hours: {expected / 3600:.1f} on H200")
    alone = [Pack(pack_id=c.trial_id, members=(c,)) for c in configs]  # unpacked: the K=1 rate
    assert estimate.estimate(configs, alone, table).startswith(
        f"GPU-hours: {len(configs) * per_trial / rates[1] / 3600:.1f}")


def test_unmeasured_presets_are_named_and_no_table_is_said():
    configs, packs = _plan("study_p", "--seeds", "1")
    assert "not estimated (no measurement): study_p on imagenet100" in estimate.estimate(
        configs, packs, {"packing": {"study_l": {"K=1": {"images_per_s": 1.0}}}})
    assert estimate.estimate(configs, packs, None).startswith("GPU-hours: no estimate (no measured throughput table")


def test_the_dry_run_reads_the_table_the_gpu_suite_keeps():
    """The launch's estimate reads where `bench/gpu_suite.py --keep` writes (a room move once broke it)."""
    assert estimate.TABLE == load_script(ROOT / "bench" / "gpu_suite.py").KEEP_PATH


def test_dry_run_prints_the_estimate_line(capsys, monkeypatch, tmp_path):
    monkeypatch.setattr(estimate, "TABLE", tmp_path / "missing.json")
    assert launcher.main(["demo", "--dry-run"]) == 0
    assert capsys.readouterr().out.splitlines()[1].startswith("GPU-hours: no estimate")  # under the summary


def test_packing_speedup_is_the_measured_rate_of_the_pack_over_a_lone_trial():
    table = {"packing": {"study_l": {"K=1": {"images_per_s": 20_000.0}, "K=4": {"images_per_s": 50_000.0},
                                     "K=8": {"images_per_s": 80_000.0}}}}
    assert estimate.packing_speedup(table, "study_l", 8) == 4.0
    assert estimate.packing_speedup(table, "study_l", 5) == 2.5  # K=5 is timed as K=4: never extrapolated
    assert estimate.packing_speedup(table, "study_l", 1) == 1.0
    assert estimate.packing_speedup(table, "study_p", 8) is None  # unmeasured preset
    configs, packs = _plan("study_l", "--datasets", "cifar10", "--seeds", "5", "--gpus-per-trial", "1", "--pack", "8")
    sizes = sorted({len(p.members) for p in packs})  # 8 and the rest of the grid
    line = estimate.estimate(configs, packs, table)
    shown = ", ".join(f"study_l K={k} x{estimate.packing_speedup(table, 'study_l', k):.1f}" for k in sizes if k > 1)
    assert line.endswith(f"; packing speed-up over lone trials: {shown}"), line
