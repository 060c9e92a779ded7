"""One torch-free vocabulary: the registries check their keys against it at import, and `--help` lists
its names without importing torch."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from records import vocab
from sweeps.studies import STUDIES

HEAVY = ("torch", "torchvision", "matplotlib", "mlflow", "ray")


def test_a_registry_that_drifts_from_the_vocabulary_is_named():
    vocab.check_registry("R", ["a", "b"], ("a", "b"), "NAMES")  # equal: silent
    with pytest.raises(ValueError, match=r"R has \['c'\], which records.vocab.NAMES lacks.*NAMES has \['b'\]"):
        vocab.check_registry("R", ["a", "c"], ("a", "b"), "NAMES")
    with pytest.raises(ValueError, match="one order"):
        vocab.check_registry("R", ["b", "a"], ("a", "b"), "NAMES")


def test_each_registry_checks_its_keys_at_import():
    # A fresh interpreter: the vocabulary gains a name no registry has, then each registry's import fails
    # naming it (and the registries import again once the name is gone).
    probe = (
        "import importlib, json, sys\n"
        "from records import vocab\n"
        "out = {}\n"
        "for attr, module in (('PES', 'trainables.model.pos_embed'), ('PRESETS', 'trainables.model.vit'),\n"
        "                     ('PROTOCOLS', 'trainables.data.protocols'), ('DATASETS', 'trainables.data.datasets')):\n"
        "    real = getattr(vocab, attr)\n"
        "    setattr(vocab, attr, (*real, 'made_up'))\n"
        "    try:\n"
        "        importlib.import_module(module)\n"
        "        out[attr] = 'imported'\n"
        "    except ValueError as exc:\n"
        "        out[attr] = str(exc)\n"
        "    setattr(vocab, attr, real)\n"
        "    for name in [m for m in sys.modules if m.startswith('trainables')]:\n"
        "        del sys.modules[name]\n"
        "import trainables.data.datasets, trainables.model.vit\n"
        "print(json.dumps(out))\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    messages = json.loads(done.stdout.strip().splitlines()[-1])
    # The torch-free table beside a registry (each data set's root check)
    # is imported by it and checks first.
    registries = {"PES": ("POS_EMBEDS",), "PRESETS": ("PRESETS",), "PROTOCOLS": ("PROTOCOLS",),
                  "DATASETS": ("DATASETS", "DATASET_SPECS")}
    for attr, names in registries.items():
        assert f"records.vocab.{attr} has ['made_up'], which trainables." in messages[attr], messages[attr]
        assert any(f".{registry} lacks" in messages[attr] for registry in names), messages[attr]


def test_protocol_names_parse_one_way_everywhere():
    from trainables.data.protocols import PROTOCOLS
    from trainables.config.switches import Protocol

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
    for name in (*STUDIES, *vocab.PES, *vocab.DATASETS, *vocab.PRESETS, *vocab.PROTOCOLS):
        assert name in top_help, f"{name!r} missing from `vitsweep --help`"
    sweep_help = subprocess.run([sys.executable, "-c", probe, "sweep", "--help"], capture_output=True, text=True,
                                timeout=120).stdout
    for name in (*STUDIES, *vocab.PES, *vocab.DATASETS, *vocab.PRESETS, "autoaugment+cutmix"):
        assert name in sweep_help, f"{name!r} missing from `vitsweep sweep --help`"
