"""bench/gpu_suite.py's CPU mode: every section of the code the H200 runs, at a tiny size; one
section's failure, or one packing row's, loses no other numbers; the suite fits its GPU slot."""

import json
import subprocess
import sys
import time
from pathlib import Path

from conftest import load_script

ROOT = Path(__file__).resolve().parents[1]
SECTIONS = ["packing", "probe", "separate", "augment", "decode", "step", "deterministic", "compile"]


def test_gpu_suite_runs_every_section_in_tiny_cpu_mode_without_ray_or_mlflow(tmp_path):
    kept = tmp_path / "measured" / "gpu_suite.json"
    # One packing row fails (crop+flip at K = 2: building its pack raises), injected from here.
    probe = ("import sys, runpy; from trainables.model import packed; init = packed.PackedViT.__init__\n"
             "def failing(self, configs, *a, **kw):\n"
             "    if len(configs) == 2 and not configs[0].cutmix: raise RuntimeError('injected row failure')\n"
             "    init(self, configs, *a, **kw)\n"
             "packed.PackedViT.__init__ = failing\n"
             "sys.argv = ['gpu_suite', '--tiny', '--section-s', '0.05', '--fail-section', "
             f"'augment', '--keep', {str(kept)!r}]; runpy.run_path('bench/gpu_suite.py', run_name='__main__'); "
             "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('ray', 'mlflow', 'pandas', 'pyarrow')); "
             "assert not bad, bad")
    done = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env={"PYTHONPATH": str(ROOT), "OUT": str(tmp_path), "PATH": "/usr/bin:/bin",
                               "CUDA_VISIBLE_DEVICES": ""})
    assert done.returncode == 0, done.stderr[-3000:]
    assert "estimated time per section" in done.stdout.splitlines()[0]
    result = json.loads((tmp_path / "gpu_suite.json").read_text())
    assert json.loads(kept.read_text()) == result  # --keep's copy is the table
    assert result["tiny"] and result["device"] == "cpu"
    sections = result["sections"]
    assert list(sections) == SECTIONS  # packing first, compile last, every one recorded
    # The injected failure is recorded as a failure; every other section still has its numbers.
    assert result["failed"] == ["augment"] and "injected" in sections["augment"]["error"]
    packing = sections["packing"]
    assert "packing" not in result["failed"] and packing["failed rows"] == ["crop+flip K=2"]
    assert "injected row failure" in packing["crop+flip K=2"]["error"]
    for group, k in (("crop+flip", 1), ("autoaugment+cutmix", 1), ("autoaugment+cutmix", 2)):  # the others
        row = packing[f"{group} K={k}"]  # through the real input path, per protocol group
        assert row["images_per_s"] > 0 and row["train_images_per_s"] > 0 and row["eval_images_per_s"] > 0
    # The rows --dry-run estimates from: K = 1 (both groups measured); K = 2 has no slower group to take.
    assert list(result["packing"]["tiny"]) == ["K=1"] and result["packing"]["tiny"]["K=1"]["images_per_s"] > 0
    probe = sections["probe"]
    assert probe["K=1"]["attention"].startswith("fused") and probe["K=2"]["attention"] == "explicit softmax"
    assert probe["K=2"]["attention_selected"] == "explicit" and probe["K=1"]["logits_dtype"] == "float32"
    separate = sections["separate"]["2 separate processes"]
    assert separate["children_ok"] == 2 and separate["images_per_s"] > 0 and "failures" not in separate
    decode = sections["decode"]
    assert decode["decode_images_per_s"] > 0
    assert decode["decoded_max_level_diff_vs_cpu"] == decode["resized_crop_max_level_diff_vs_cpu"] == 0  # CPU vs CPU
    assert sections["step"]["eager_step_images_per_s"] > 0
    assert "CUDA only" in sections["deterministic"]["skipped"] and "CUDA only" in sections["compile"]["skipped"]
    assert "section" in done.stdout and "packing" in done.stdout


def test_a_tiny_table_is_never_kept_as_the_measured_one(tmp_path):
    done = subprocess.run([sys.executable, "bench/gpu_suite.py", "--tiny", "--keep"], cwd=ROOT, capture_output=True,
                          text=True, timeout=300, env={"PYTHONPATH": str(ROOT), "OUT": str(tmp_path),
                                                       "PATH": "/usr/bin:/bin", "CUDA_VISIBLE_DEVICES": ""})
    assert done.returncode == 2 and "no GPU measurement" in done.stderr
    assert not (tmp_path / "gpu_suite.json").exists()


def _suite():
    return load_script(ROOT / "bench" / "gpu_suite.py")


def test_the_section_estimates_fit_below_the_default_deadline():
    suite = _suite()
    assert [name for name, _, _ in suite.SECTIONS] == SECTIONS
    assert sum(estimate for _, _, estimate in suite.SECTIONS) < suite.DEADLINE_S <= 330


def test_a_silent_child_ends_the_barrier_at_its_deadline():
    suite = _suite()
    talk = "print('READY', flush=True)"
    procs = [subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
             for code in (talk + "; import time; time.sleep(60)", "import time; time.sleep(60)", "pass")]
    try:
        start = time.monotonic()
        found = suite.wait_for_lines(procs, "READY", time.monotonic() + 3)
        assert time.monotonic() - start < 10  # the silent child did not hold the barrier past its deadline
        assert found == ["READY\n", "", ""]  # ready; silent; exited without a word
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


def test_the_attention_label_reads_the_sdpa_op_not_the_convolution():
    """On CUDA the patch embedding's Conv2d dispatches aten::cudnn_convolution whatever attention ran;
    only the SDPA op the dispatcher chose names the kernel (synthetic profiles: op names as
    torch.profiler's key_averages() gives them)."""
    label = _suite().attention_label
    step = ["aten::conv2d", "aten::cudnn_convolution", "aten::convolution_backward", "aten::addmm",
            "aten::layer_norm", "aten::scaled_dot_product_attention", "void cutlass::Kernel<...>"]
    assert label(step + ["aten::_scaled_dot_product_flash_attention",
                         "aten::_scaled_dot_product_flash_attention_backward", "aten::_flash_attention_forward",
                         "flash_fwd_kernel<...>"]) == "fused: flash"
    assert label(step + ["aten::_scaled_dot_product_efficient_attention",
                         "aten::_efficient_attention_forward", "fmha_cutlassF_bf16_aligned_64x64_rf_sm80"]) \
        == "fused: memory-efficient"
    assert label(step + ["aten::_scaled_dot_product_cudnn_attention",
                         "cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16"]) == "fused: cuDNN"
    assert label(step + ["aten::_scaled_dot_product_flash_attention_for_cpu"]) == "fused: flash"
    assert label(step + ["aten::_scaled_dot_product_attention_math", "aten::_softmax"]) \
        == "math (SDPA's unfused fallback)"
    # The pack's explicit path calls no SDPA op at all: the cuDNN convolution names no attention.
    assert label(step + ["aten::softmax", "aten::_softmax", "aten::bmm"]) == "explicit softmax"
    assert label(["aten::cudnn_convolution", "aten::addmm"]) == "unknown"


def test_a_child_past_its_bound_is_killed_and_its_finished_rows_kept():
    """The compile section's bound (`child_rows`): a child that reports one row, then hangs as a cold
    compile may, is killed at its bound with what it reported; a child that exits early says so."""
    suite = _suite()
    hang = ("import json, time; print('ROW ' + json.dumps({'name': 'eager K=1', 'images_per_s': 5.0}), flush=True); "
            "time.sleep(600)")
    seen = []
    rows, stopped = suite.child_rows([sys.executable, "-c", hang], "ROW ", 3, on_row=seen.append)
    assert rows == {"eager K=1": {"images_per_s": 5.0}} and stopped == "killed at its bound of 3 s"
    assert seen == [rows]  # handed on as it came, before the bound
    rows, stopped = suite.child_rows([sys.executable, "-c", "import sys; print('ROW {\"name\": \"a\"}'); "
                                      "sys.exit('compile failed')"], "ROW ", 60)
    assert rows == {"a": {}} and stopped.startswith("exit 1: compile failed")
    rows, stopped = suite.child_rows([sys.executable, "-c", "print('noise'); print('ROW {\"name\": \"b\", \"x\": 1}')"],
                                     "ROW ", 60)
    assert rows == {"b": {"x": 1}} and stopped is None
