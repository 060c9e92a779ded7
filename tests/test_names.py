"""One torch-free vocabulary: the PE registry checks its keys against it at import, a data set's or a
preset's name is its row's key, and `--help` lists the names without importing torch."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from records import vocab
from sweeps.studies import STUDIES
from trainables.config.architecture import PRESETS
from trainables.config.data_roots import DATASET_SPECS

HEAVY = ("torch", "torchvision", "matplotlib", "mlflow", "ray")


def test_a_registry_that_drifts_from_the_vocabulary_is_named():
    vocab.check_registry("R", ["a", "b"], ("a", "b"), "NAMES")  # equal: silent
    with pytest.raises(ValueError, match=r"R has \['c'\], which records.vocab.NAMES lacks.*NAMES has \['b'\]"):
        vocab.check_registry("R", ["a", "c"], ("a", "b"), "NAMES")
    with pytest.raises(ValueError, match="one order"):
        vocab.check_registry("R", ["b", "a"], ("a", "b"), "NAMES")


def test_the_pe_registry_checks_its_keys_at_import():
    # A fresh interpreter: the vocabulary gains a PE name the registry lacks, and its import fails naming it.
    probe = (
        "from records import vocab\n"
        "vocab.PES = (*vocab.PES, 'made_up')\n"
        "try:\n"
        "    import trainables.model.pos_embed\n"
        "except ValueError as exc:\n"
        "    print(exc)\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "records.vocab.PES has ['made_up'], which trainables.model.pos_embed.POS_EMBEDS lacks" in done.stdout


def test_protocol_names_parse_one_way_everywhere():
    from trainables.data.protocols import PROTOCOLS
    from trainables.config.switches import Protocol

    # Built one way: every setting of the switches in the report's order, then the alias; the registry's keys.
    assert list(PROTOCOLS) == list(vocab.PROTOCOLS) == [
        "baseline", "label_smoothing", "cutmix", "cutmix+label_smoothing", "autoaugment", "autoaugment+label_smoothing",
        "autoaugment+cutmix", "autoaugment+cutmix+label_smoothing", "modern"]
    for name in vocab.PROTOCOLS:
        switches = vocab.protocol_switches(name)
        assert Protocol.from_name(name) == Protocol(**switches) == PROTOCOLS[name]
        assert vocab.protocol_name(**switches) == Protocol(**switches).name == vocab.canonical_protocol(name)
    assert vocab.protocol_switches("cutmix+label_smoothing") == {"autoaugment": False, "cutmix": True,
                                                                  "label_smoothing": True}
    assert vocab.canonical_protocol("modern") == vocab.MODERN == "autoaugment+cutmix+label_smoothing"
    with pytest.raises(ValueError, match=r"unknown protocol 'cutmix\+autoaugment'"):
        vocab.protocol_switches("cutmix+autoaugment")  # only the stored order is a name


def test_the_results_path_rule(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    from records import layout

    assert layout.results_location("s3://bucket/x") == "s3://bucket/x"
    assert layout.results_location("results") == str(tmp_path / "results")


def test_help_imports_no_heavy_library_and_lists_the_names():
    # A fresh interpreter per command: what help imports is what a user waits for.
    probe = (
        "import contextlib, io, json, sys\n"
        "from sweeps import cli\n"
        "out = io.StringIO()\n"
        "with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):\n"
        "    cli.main(sys.argv[1:])\n"
        f"heavy = sorted(m for m in {HEAVY!r} if m in sys.modules)\n"
        "print(json.dumps({'heavy': heavy, 'help': out.getvalue()}))\n"
    )
    for argv in (["--help"], ["sweep", "--help"], ["analyze", "--help"], ["report", "--help"], ["status", "--help"]):
        done = subprocess.run([sys.executable, "-c", probe, *argv], capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        result = json.loads(done.stdout.strip().splitlines()[-1])
        assert result["heavy"] == [], f"vitsweep {' '.join(argv)} imported {result['heavy']}"
        assert "usage:" in result["help"]
    top_help = subprocess.run([sys.executable, "-c", probe, "--help"], capture_output=True, text=True,
                              timeout=120).stdout
    for name in (*STUDIES, *vocab.PES, *DATASET_SPECS, *PRESETS, *vocab.PROTOCOLS):
        assert name in top_help, f"{name!r} missing from `vitsweep --help`"
    sweep_help = subprocess.run([sys.executable, "-c", probe, "sweep", "--help"], capture_output=True, text=True,
                                timeout=120).stdout
    for name in (*STUDIES, *vocab.PES, *DATASET_SPECS, *PRESETS, "autoaugment+cutmix"):
        assert name in sweep_help, f"{name!r} missing from `vitsweep sweep --help`"
