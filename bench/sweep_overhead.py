"""Per-trial overhead of Tune + Train against plain Python, same machine, one run.

    python bench/sweep_overhead.py --trials 4

Trains N short demo trials twice: back to back with ``trainables.train.train``
in this process (the baseline), and through the launcher (Tune function
trainable -> TorchTrainer -> the same loop) on a fresh local Ray with one
trial at a time, so the difference is pure orchestration: actor and worker
process start-up, imports, MLflow runs, Parquet writes and checkpoint
uploads. Prints both wall times, their ratio and the overhead per trial.
Target: < 10 s per trial on a 2-core machine.

    python bench/sweep_overhead.py --seeds 4 --pack 8     # 16 trials in 2 packs of 8

With ``--pack K`` both sides train the same packs (``sweeps/packs.py``): the
baseline runs ``train_pack`` on each pack back to back, the launcher runs one
Tune trial and one Train run per pack, so the difference is again pure
orchestration, now shared by the K members of a pack (target: < 3 s per
trial at K = 8).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sweeps import options  # noqa: E402
from sweeps import run as launcher  # noqa: E402
from trainables.train import train, train_pack  # noqa: E402

SETTINGS = ["--set", "epochs=2", "--set", "max_train_images=1024"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=0, help="demo trials to run each way (0: all)")
    parser.add_argument("--seeds", type=int, default=1, help="demo seeds: 4 trials per seed")
    parser.add_argument("--pack", type=int, default=1, help="pack size K (1: every trial alone)")
    args = parser.parse_args()

    p = launcher.argparse.ArgumentParser()
    options.add_arguments(p)
    with tempfile.TemporaryDirectory() as tmp:
        sweep_args = p.parse_args(["demo", "--results", f"{tmp}/ray", "--max-concurrent", "1", *SETTINGS,
                                   "--seeds", str(args.seeds), "--pack", str(args.pack)])
        configs = options.build_trials(sweep_args)
        configs = configs[: args.trials] if args.trials else configs
        packs = options.build_packs(sweep_args, configs)

        t0 = time.perf_counter()
        for pack in packs:
            if len(pack.members) == 1:
                train(pack.members[0], Path(tmp) / "plain" / pack.pack_id, log=lambda *_: None)
            else:
                train_pack(pack.members, [Path(tmp) / "plain" / c.trial_id for c in pack.members], log=lambda *_: None)
        plain = time.perf_counter() - t0

        import ray

        from trainables.ray_start import init_ray

        init_ray(num_cpus=2, configure_logging=False, log_to_driver=False)
        results, storage = launcher.resolve_paths(sweep_args)
        mlflow_uri = launcher.resolve_tracking(sweep_args, results)
        t0 = time.perf_counter()
        status = launcher.train_stage(sweep_args, configs, results, storage, mlflow_uri)
        swept = time.perf_counter() - t0
        ray.shutdown()
    assert status == 0, "the sweep failed"
    n = len(configs)
    print(f"\n{n} trials in {len(packs)} packs (demo, 2 epochs x 1024 images, tiny ViT), one pack at a time")
    print(f"  plain Python back to back : {plain:7.1f} s  ({plain / n:5.1f} s/trial)")
    print(f"  Tune + Train              : {swept:7.1f} s  ({swept / n:5.1f} s/trial)")
    print(f"  ratio                     : {swept / plain:7.2f}x")
    target = "< 3 s at K = 8" if args.pack > 1 else "< 10 s"
    print(f"  overhead per trial        : {(swept - plain) / n:7.1f} s  (target {target})")


if __name__ == "__main__":
    main()
