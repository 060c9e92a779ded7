"""Per-trial overhead of Tune + Train against plain Python, same machine, one run.

    python bench/sweep_overhead.py --trials 4

Trains N short demo trials twice: back to back with ``trainables.loop.train.train``
in this process (the baseline), and through the launcher (Tune function
trainable -> TorchTrainer -> the same loop) on a fresh local Ray with one
trial at a time, so the difference is pure orchestration: actor and worker
process start-up, imports, MLflow runs, Parquet writes and checkpoint
uploads. Prints both wall times, their ratio and the overhead per trial.
Target: < 10 s per trial on a 2-core machine.

    python bench/sweep_overhead.py --seeds 4 --pack 8     # 16 trials in 2 packs of 8

With ``--pack K`` both sides train the same packs (``sweeps/launch/packs.py``): the
baseline runs ``train_pack`` on each pack back to back, the launcher runs one
Tune trial and one Train run per pack, so the difference is again pure
orchestration, now shared by the K members of a pack (target: < 3 s per
trial at K = 8).

    python bench/sweep_overhead.py --split --before f011b34 --reps 2   # a pack's fixed cost, split

``--split`` takes a pack's start-up apart, for the code at ``--before`` (a ``git archive`` of that
revision) and the working tree side by side, ``--reps`` times each in turn (medians), in CPU seconds
(user + system: the machine may be shared, where wall times mean little). Each side's child process
starts a local Ray and runs ``--packs`` Train runs of the demo's first pack (``--pack`` members, 2
epochs x 1024 images) one after the other, as a launch does; the Train worker's loop is this bench's
(``stand_in_worker``: the stages of ``trainables.trial.ray_trial.train_worker`` up to training, each timed):

    process + Train worker start   the worker process's CPU when its loop starts
    imports                        the worker's entry (trainables.trial.ray_trial) and the MLflow client it uses
    data load                      train.pack_inputs: the data set and the pack's sources
    model build                    PackedViT and its optimiser
    first step                     the first pack_step less the second (lazy set-up, allocator)
    Ray (rest)                     every other process of the Ray tree over the run (polled, `TreeCPU`):
                                   controller, placement-group cleaner, raylet, GCS, the pool's next workers

The first pack of a node and a later one are shown apart (a data set shared per node is decoded by
the first only). ``--compile`` adds a compiled (inductor, CPU) first step in a fresh process with an
empty inductor cache, then in another fresh process with the cache the first left (the FX graph and
AOT autograd caches every worker of a node shares): what a worker after the first pays.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if os.environ.get("SPLIT_TREE") is None:  # a --split child imports the tree it measures (PYTHONPATH)
    sys.path.insert(0, str(ROOT))

from sweeps import run as launcher  # noqa: E402
from sweeps.launch import options  # noqa: E402

SETTINGS = ["--set", "epochs=2", "--set", "max_train_images=1024"]
STAGES = ("process + Train worker start", "imports", "data load", "model build", "first step", "Ray (rest)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=0, help="demo trials to run each way (0: all)")
    parser.add_argument("--seeds", type=int, default=1, help="demo seeds: 4 trials per seed")
    parser.add_argument("--pack", type=int, default=1, help="pack size K (1: every trial alone)")
    parser.add_argument("--split", action="store_true", help="a pack's fixed cost by stage, --before against now")
    parser.add_argument("--before", default="HEAD", help="--split: the git revision to compare with")
    parser.add_argument("--reps", type=int, default=1, help="--split: runs of each side, in turn")
    parser.add_argument("--packs", type=int, default=2,
                        help="--split: Train runs per child (the node's first, then later ones)")
    parser.add_argument("--compile", action="store_true", help="--split: the compiled first step, cold and warm cache")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(globals()[args.child](args)))
        return
    if args.split:
        split(args)
        return
    from trainables.loop.train import train, train_pack

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

        from trainables.trial.ray_start import init_ray

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



# -- --split ---------------------------------------------------------------------------------


def split(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        before = Path(tmp) / "before"
        before.mkdir()
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", args.before], check=True, capture_output=True)
        subprocess.run(["tar", "-x", "-C", str(before)], input=archive.stdout, check=True)
        trees = {"before": before, "after": ROOT}
        runs: dict[str, list[dict]] = {side: [] for side in trees}
        for _ in range(args.reps):
            for side, tree in trees.items():
                runs[side].append(_child(tree, "packs_child", args))
                if args.compile:
                    runs[side][-1]["compile"] = _child(tree, "compile_child", args)
    rev = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", args.before], capture_output=True,
                         text=True).stdout.strip()
    print(f"\na demo pack of {args.pack} (2 epochs x 1024 images), CPU seconds (user + system), median of "
          f"{args.reps}; before: {rev}, after: the working tree")
    for index, title in ((0, "the node's first pack"), (args.packs - 1, "a later pack")):
        print(f"\n{title:32s} {'before':>8s} {'after':>8s} {'after/before':>13s}")
        totals = {}
        for stage in (*STAGES, "total"):
            b, a = (statistics.median(run["packs"][index][stage] for run in runs[side]) for side in trees)
            totals[stage] = (b, a)
            print(f"  {stage:30s} {b:8.2f} {a:8.2f} {a / b if b > 0.005 else float('nan'):13.2f}")
        b, a = totals["total"]
        print(f"  {'per trial (total / K)':30s} {b / args.pack:8.2f} {a / args.pack:8.2f}")
    heavy = {side: runs[side][0]["packs"][-1]["heavy modules"] for side in trees}
    print(f"\nheavy modules in the worker, before: {', '.join(heavy['before'])}")
    print(f"                             after:  {', '.join(heavy['after'])}")
    print(f"the workers' inductor cache: {runs['after'][0]['packs'][-1]['inductor cache']}")
    if args.compile:
        print(f"\ncompiled first step (inductor, CPU)  {'before':>8s} {'after':>8s}")
        for cache in ("cold cache", "warm cache"):
            b, a = (statistics.median(run["compile"][cache] for run in runs[side]) for side in trees)
            print(f"  {cache:34s} {b:8.2f} {a:8.2f}")


def _child(tree: Path, function: str, args: argparse.Namespace) -> dict:
    env = {**os.environ, "SPLIT_TREE": str(tree), "PYTHONPATH": str(tree)}
    out = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--child", function, "--pack", str(args.pack),
                          "--packs", str(args.packs)], cwd=tree, env=env, capture_output=True, text=True)
    if out.returncode:
        raise RuntimeError(f"{function} in {tree} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def _demo_pack(k: int, results: str) -> list[dict]:
    p = launcher.argparse.ArgumentParser()
    options.add_arguments(p)
    sweep_args = p.parse_args(["demo", "--results", results, *SETTINGS, "--pack", str(k)])
    configs = options.build_trials(sweep_args)
    return [c.to_flat() for c in options.build_packs(sweep_args, configs)[0].members]


class TreeCPU:
    """CPU seconds of every process under this one (not itself) from ``start()`` to ``stop()``, polled
    every 0.1 s, so a process that ends in between (a Train worker, the controller) keeps what it used
    up to its last poll: a dead process's time is lost to its parent's accounting when nobody waits
    for it, and is counted in full when somebody does, either of which would swing a before-and-after."""

    def __init__(self):
        import threading

        self.seen: dict[int, float] = {}
        self.base: dict[int, float] = {}
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._poll, daemon=True)

    def _sample(self) -> dict[int, float]:
        import psutil

        out = {}
        for proc in psutil.Process().children(recursive=True):
            try:
                times = proc.cpu_times()
                out[(proc.pid, proc.create_time())] = times.user + times.system
            except psutil.Error:
                pass
        return out

    def _poll(self) -> None:
        while not self.stopping.wait(0.1):
            self.seen.update(self._sample())

    def start(self) -> TreeCPU:
        self.base = self._sample()
        self.thread.start()
        return self

    def stop(self, settle_s: float = 3.0) -> float:
        time.sleep(settle_s)  # the run's controller and cleaner exit
        self.stopping.set()
        self.thread.join()
        return sum(cpu - self.base.get(key, 0.0) for key, cpu in self.seen.items())


def packs_child(args: argparse.Namespace) -> dict:
    """One side: a local Ray, then --packs Train runs of the demo's first pack with the stand-in loop."""
    import ray
    from ray.train import RunConfig, ScalingConfig
    from ray.train.v2.api.data_parallel_trainer import DataParallelTrainer

    from trainables.trial.ray_start import init_ray

    with tempfile.TemporaryDirectory() as tmp:
        flats = _demo_pack(args.pack, f"{tmp}/results")
        init_ray(num_cpus=2, configure_logging=False, log_to_driver=False)
        packs = []
        for number in range(args.packs):
            trainer = DataParallelTrainer(stand_in_worker, train_loop_config={"trials": flats},
                                          scaling_config=ScalingConfig(num_workers=1, resources_per_worker={"CPU": 1}),
                                          run_config=RunConfig(name=f"split-{number}", storage_path=f"{tmp}/train"))
            ray_cpu = TreeCPU().start()
            stages = trainer.fit().return_value
            # Everything else the run cost: its controller, placement-group cleaner, raylet, GCS, ...
            stages["Ray (rest)"] = ray_cpu.stop() - stages.pop("worker")
            stages["total"] = sum(stages[stage] for stage in STAGES)
            packs.append(stages)
        ray.shutdown()
    return {"packs": packs}


def stand_in_worker(config: dict) -> dict:
    """The Train worker's stages up to training (see ``--split``), each in this process's CPU seconds."""
    import time

    t = {"process + Train worker start": time.process_time()}
    mark = time.process_time()

    def lap(stage: str) -> None:
        nonlocal mark
        t[stage] = time.process_time() - mark
        mark = time.process_time()

    import mlflow.tracking  # noqa: F401  (the worker's MLflow client, records.client)

    from trainables.trial import ray_trial

    if hasattr(ray_trial, "node_folder"):  # as train_worker does
        os.environ["VITSWEEP_DATA_SHARED"] = str(ray_trial.node_folder())
    import torch

    from trainables.data.inputs import pack_epoch
    from trainables.loop.optim import build_optimizer
    from trainables.loop.train import epoch_seed, pack_inputs, pack_step, resolve_device
    from trainables.model.packed import PackedViT
    from trainables.config.run_config import RunConfig
    lap("imports")
    cfgs = [RunConfig.from_flat(flat) for flat in config["trials"]]
    device = resolve_device(cfgs[0].device)
    data, sources, _, _ = pack_inputs(cfgs, device)
    lap("data load")
    pack = PackedViT(cfgs, device, log=lambda *_: None)
    optimizer = pack.optimizer(build_optimizer, cfgs[0])
    lap("model build")
    steps = pack_epoch(sources, [c.seed for c in cfgs], epoch=1, batch_size=cfgs[0].batch_size)
    first, second = next(steps), next(steps)  # one chunk of augmented batches (not timed as a step)
    mark = time.process_time()
    step_times = []
    for batches in (first, second):
        pack_step(pack, optimizer, cfgs, batches, num_classes=data.num_classes, mean=data.mean, std=data.std,
                  mix_gens=[torch.Generator().manual_seed(epoch_seed(c.seed, 1, 2)) for c in cfgs],
                  perm_gens=[torch.Generator().manual_seed(epoch_seed(c.seed, 1, 3)) for c in cfgs], use_amp=False)
        step_times.append(time.process_time() - mark)
        mark = time.process_time()
    t["first step"] = max(0.0, step_times[0] - step_times[1])
    t["worker"] = time.process_time()  # all of this process's CPU (the driver takes it out of the tree's)
    from torch._inductor.runtime.cache_dir_utils import cache_dir

    t["inductor cache"] = cache_dir()  # where this worker's compiles are cached (shared by the node's workers)
    t["heavy modules"] = sorted({m.split(".")[0] for m in sys.modules} & {
        "pandas", "scipy", "matplotlib", "mlflow", "sklearn", "torchvision", "timm", "sympy", "triton", "pyarrow",
        "fastapi", "pydantic", "sqlalchemy", "PIL"})
    return t


def compile_child(args: argparse.Namespace) -> dict:
    """The compiled first step (inductor on the CPU) in a fresh process with an empty cache, then in a
    fresh process with the cache the first left."""
    out = {}
    with tempfile.TemporaryDirectory() as cache:
        env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": cache}
        for name in ("cold cache", "warm cache"):
            run = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--child", "compiled_step",
                                  "--pack", str(args.pack)], env=env, capture_output=True, text=True)
            if run.returncode:
                raise RuntimeError(run.stderr[-3000:])
            out[name] = json.loads(run.stdout.strip().splitlines()[-1])["cpu"]
    return out


def compiled_step(args: argparse.Namespace) -> dict:
    import torch

    from trainables.loop.optim import build_optimizer
    from trainables.loop.train import member_losses
    from trainables.model.compiled import compile_forward
    from trainables.model.packed import PackedViT
    from trainables.config.run_config import RunConfig

    with tempfile.TemporaryDirectory() as tmp:
        cfgs = [RunConfig.from_flat(flat) for flat in _demo_pack(args.pack, f"{tmp}/results")]
    pack = PackedViT(cfgs, torch.device("cpu"), log=lambda *_: None)
    optimizer = pack.optimizer(build_optimizer, cfgs[0])
    compile_forward(pack)
    size = cfgs[0].model.img_size
    x = torch.randn(pack.k, cfgs[0].batch_size, 3, size, size)
    target = torch.softmax(torch.randn(pack.k, cfgs[0].batch_size, 10), -1)
    start = time.process_time()
    losses, _ = member_losses(pack, x, target, [None] * pack.k, use_amp=False)
    losses.sum().backward()
    optimizer.step()
    return {"cpu": time.process_time() - start}


if __name__ == "__main__":
    main()
