"""The console's vitsweep lines: one per ended trial, from its trials row, with an ETA; a summary."""

from __future__ import annotations

import io

from records import tables
from sweeps import progress


def test_trial_lines_say_score_or_failure():
    ok = {"status": "finished", "test_acc": 0.4812, "wall_time_s": 84.0}
    assert progress.trial_line(3, 60, ok, "t3") == "[3/60] t3: test 0.481 in 84 s"
    holdout = {"status": "finished", "test_acc": None, "eval_acc": 0.5, "wall_time_s": 4000.0, "did_not_learn": True}
    assert progress.trial_line(1, 2, holdout, "h") == "[1/2] h: holdout 0.500 (did not learn) in 67 min"
    bad = {"status": "failed", "epochs_completed": 12, "error": "loss is nan at epoch 12", "wall_time_s": 30.0}
    assert progress.trial_line(4, 60, bad, "t4") == "[4/60] t4: FAILED after 12 epoch(s) (loss is nan at epoch 12) in 30 s"
    assert "without a record" in progress.trial_line(5, 60, None, "t5")


def test_a_pack_prints_each_member_once_with_an_eta(tmp_path):
    results = str(tmp_path)
    for tid, acc in (("a", 0.5), ("b", 0.25)):
        tables.write_trial(results, "s", {}, {"trial_id": tid, "study": "s", "status": "finished",
                                              "test_acc": acc, "wall_time_s": 10.0})
    out = io.StringIO()
    p = progress.TrialProgress(results, "s", total=3, members={"pack-1": ["a", "b"]}, stream=out)
    p.ended("pack-1")
    p.ended("pack-1")  # Tune may report an error after completion: no member is counted twice
    lines = out.getvalue().splitlines()
    assert [line.split(":")[0] for line in lines] == ["[1/3] a", "[2/3] b"]
    assert "ETA" in lines[0] and "test 0.500" in lines[0]
    p.ended("c")  # a trial alone is its own Tune trial; it left no row
    assert "[3/3] c" in out.getvalue() and "ETA" not in out.getvalue().splitlines()[-1]
    assert p.summary().startswith("s: 3 of 3 trials ended") and "2 finished" in p.summary()


def test_the_callback_survives_tunes_pickling_on_a_real_terminal(tmp_path):
    # Tune pickles its callbacks with its state; a progress object holding sys.stdout would not pickle.
    import pickle

    import ray.cloudpickle

    p = progress.TrialProgress(str(tmp_path), "s", total=1, members={})
    assert pickle.loads(ray.cloudpickle.dumps(p.as_callback())) is not None


def test_the_closing_lines_name_a_report_only_when_there_is_one(tmp_path):
    results = str(tmp_path)
    tables.write_trial(results, "s", {}, {"trial_id": "a", "study": "s", "status": "finished"})
    after_train = progress.closing_lines(results, "s", "sqlite:////x/mlflow.db", report=False)
    assert "report:" not in after_train and "trials: 1 finished" in after_train
    assert f"report:         {results}/s/report/index.html" in progress.closing_lines(results, "s", "sqlite:////x.db")


def test_the_summary_comes_from_the_trials_table_not_from_what_the_callback_counted(tmp_path):
    # A restored Tune run revives the killed launcher's callback: the summary must not depend on it.
    results = str(tmp_path)
    for tid, state in (("a", "finished"), ("b", "failed")):
        tables.write_trial(results, "s", {}, {"trial_id": tid, "study": "s", "status": state})
    p = progress.TrialProgress(results, "s", total=3, members={"a": ["a"], "b": ["b"], "c": ["c"]}, stream=io.StringIO())
    assert p.summary().startswith("s: 2 of 3 trials ended") and "(1 failed, 1 finished, 1 not started)" in p.summary()
