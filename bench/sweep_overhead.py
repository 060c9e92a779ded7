"""Per-trial overhead of Tune + Train against plain Python, same machine, one run.

    python bench/sweep_overhead.py --trials 4

Trains N short demo trials twice: back to back with ``trainables.train.train``
in this process (the baseline), and through the launcher (Tune function
trainable -> TorchTrainer -> the same loop) on a fresh local Ray with one
trial at a time, so the difference is pure orchestration: actor and worker
process start-up, imports, MLflow runs, Parquet writes and checkpoint
uploads. Prints both wall times, their ratio and the overhead per trial.
Target: < 10 s per trial on a 2-core machine.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sweeps import run as launcher  # noqa: E402
from trainables.train import train  # noqa: E402

SETTINGS = ["--set", "epochs=2", "--set", "max_train_images=1024"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=4, help="demo trials to run each way (at most 4)")
    args = parser.parse_args()

    p = launcher.argparse.ArgumentParser()
    launcher.add_arguments(p)
    with tempfile.TemporaryDirectory() as tmp:
        sweep_args = p.parse_args(["demo", "--results", f"{tmp}/ray", "--max-concurrent", "1", *SETTINGS])
        configs = launcher.build_trials(sweep_args)[: args.trials]

        t0 = time.perf_counter()
        for cfg in configs:
            train(cfg, Path(tmp) / "plain" / cfg.trial_id, log=lambda *_: None)
        plain = time.perf_counter() - t0

        import ray

        from trainables.ray_trainable import init_ray

        init_ray(num_cpus=2, configure_logging=False, log_to_driver=False)
        results, storage, mlflow_uri = launcher.resolve_locations(sweep_args)
        t0 = time.perf_counter()
        status = launcher.train_stage(sweep_args, configs, results, storage, mlflow_uri)
        swept = time.perf_counter() - t0
        ray.shutdown()
    assert status == 0, "the sweep failed"
    n = len(configs)
    print(f"\n{n} trials (demo, 2 epochs x 1024 images, tiny ViT), one at a time")
    print(f"  plain Python back to back : {plain:7.1f} s  ({plain / n:5.1f} s/trial)")
    print(f"  Tune + Train              : {swept:7.1f} s  ({swept / n:5.1f} s/trial)")
    print(f"  ratio                     : {swept / plain:7.2f}x")
    print(f"  overhead per trial        : {(swept - plain) / n:7.1f} s  (target < 10 s)")


if __name__ == "__main__":
    main()
