"""bench/_results.py's Journal and SearchClock: a stopped benchmark context resumes after its last finished step,
and a search that took several runs is timed over all of them."""
import json
import math
import sys
from pathlib import Path

from autosync.strategy import Strategy

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
from _results import Journal, SearchClock, commit  # noqa: E402


def test_journal_keeps_finished_steps_and_resumes_after_them(tmp_path):
    path = tmp_path / "ctx.steps.json"
    key = {"goal": 2.5, "measure": 8}
    calls = []

    def step(value):
        def run():
            calls.append(value)
            return value
        return run

    strategy = Strategy.from_dict({"sync": {"mode": "local_sgd", "period": 4},
                                   "groups": [{"compressor": {"name": "powersgd", "rank": 4}}]})
    j = Journal(path, key)
    assert j.resumed == []
    first = j.step("search tune m8", step({"strategy": strategy.canonical(), "search_s": 12.5}))
    timed = j.step("train default first", step({"time_s": None, "reached": math.nan}))
    assert len(calls) == 2 and calls[0] == first and timed["time_s"] is None and math.isnan(timed["reached"])
    assert path.exists() and not list(tmp_path.glob("*.tmp"))

    # a stopped run: a new process reads what was finished and does not run it again
    again = Journal(path, dict(key))
    assert again.resumed == ["search tune m8", "train default first"]
    by = again.resumed_by()     # who ran each kept step: this checkout's commit and a date
    assert list(by) == again.resumed and all(v.startswith(commit() + ", ") and "UTC" in v for v in by.values()), by
    kept = again.step("search tune m8", step("must not run"))
    assert Strategy.from_dict(kept["strategy"]).hash == strategy.hash and kept["search_s"] == 12.5
    assert math.isnan(again.step("train default first", step("must not run"))["reached"])
    assert again.step("train default last", step({"time_s": 40.0})) == {"time_s": 40.0}
    assert len(calls) == 3 and calls[2] == {"time_s": 40.0}
    assert json.loads(path.read_text())["steps"]["train default last"] == {"time_s": 40.0}

    # other settings: what was kept does not hold, the context starts over
    other = Journal(path, dict(key, goal=2.4))
    assert other.resumed == []
    assert other.step("search tune m8", step("ran")) == "ran"

    other.close()
    assert not path.exists()
    Journal(path, key).close()      # nothing to remove: no error


def test_a_resumed_contexts_row_names_the_commits_of_both_runs():
    import time_to_quality as ttq

    row = {"measured_by": "bbbbbbb, 2026-12-04 17:28 UTC"}
    assert ttq.measured_by(row) == "bbbbbbb"
    row.update(resumed_after=["search Optuna alone", "search tune m0"],
               resumed_by={"search Optuna alone": "aaaaaaa, 2026-12-03 20:00 UTC",
                           "search tune m0": "bbbbbbb, 2026-12-04 16:00 UTC"})
    assert ttq.measured_by(row) == "bbbbbbb (resumed after steps by aaaaaaa)"
    # a context resumed before the journal kept who ran each step (ncf 3x1@200mbit) does not pass for one commit's
    del row["resumed_by"]
    assert ttq.measured_by(row) == "bbbbbbb (resumed after steps by an unrecorded commit)"


def test_a_retrained_arm_is_named_and_only_failed_arms_are_retrained():
    import time_to_quality as ttq

    ok = {"source": "ddp_default", "hash": "d", "time_s": 10.0}
    row = {"workload": "moe-tiny", "cluster": "3x1@200mbit", "measured_by": "bbbbbbb, 2026-12-04 07:45 UTC",
           **{a: dict(ok) for a in ttq.ARMS}}
    assert ttq.failed_arms(row) == [] and ttq.failed_arms({"left_out": "too slow"}) == []
    row["best baseline"] = {"source": "asp", "hash": "a", "time_s": None, "failed": "failed: rank 2: RuntimeError"}
    assert ttq.failed_arms(row) == ["best baseline"]
    row["retrained"] = {"best baseline": {"by": "ccccccc, 2026-12-05 00:10 UTC", "failed_before": "failed: ..."}}
    assert ttq.measured_by(row) == "bbbbbbb (best baseline retrained by ccccccc)"


def test_each_arm_of_an_online_tuning_row_names_the_code_that_measured_it():
    import online_tuning as ot

    row = {"DDP default": {}, "auto point": {}, "tune m0": {}, "auto": {},
           "measured_by": "c, 2026-12-06 20:05 UTC (auto point); the rest b, 2026-12-06 18:25 UTC (DDP default, "
                          "auto point, tune m0); the rest a, 2026-12-06 11:04 UTC"}
    assert ot.arm_provenance(row) == {"DDP default": "b, 2026-12-06 18:25 UTC", "auto": "a, 2026-12-06 11:04 UTC",
                                      "auto point": "c, 2026-12-06 20:05 UTC", "tune m0": "b, 2026-12-06 18:25 UTC"}
    assert set(ot.arm_provenance({"DDP default": {}, "measured_by": "a, d"}).values()) == {"a, d"}
    row["arm_measured_by"] = {"auto point": "d, 2026-12-07 09:00 UTC"}
    assert ot.arm_provenance(row)["auto point"] == "d, 2026-12-07 09:00 UTC"


def test_the_readmes_results_table_is_what_bench_summary_writes():
    """README's figures come from the result files: re-run a benchmark, then `python bench/summary.py --readme
    README.md`. Every file the table quotes opens with its command, commit and date."""
    import summary

    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    assert summary.readme_block(readme) == summary.render()
    for _, _, name in summary.figures():
        assert set(summary.header(name)) == {"Command", "Commit", "Date"}


def test_the_readme_stays_a_users_guide_and_no_page_a_user_reads_names_a_session():
    """README is a guide under 250 lines (reference goes to docs/); history is told by dates and commits."""
    import re

    root = Path(__file__).resolve().parent.parent
    assert len((root / "README.md").read_text().splitlines()) < 250
    pages = [root / "README.md", *(root / "docs").glob("*.md"), *(root / "autosync").rglob("*.py"),
             *(root / "autosync").rglob("*.md"), *(root / "bench").rglob("*.py"), *(root / "bench").rglob("*.md")]
    said = [f"{p.relative_to(root)}" for p in pages if re.search(r"session [0-9]", p.read_text(), re.I)]
    assert said == []


def test_a_search_clock_sums_the_runs_that_took_part_in_the_search_a_stopped_one_included(tmp_path):
    import time

    path = tmp_path / "search_clock.json"
    with SearchClock(path, every_s=0.05) as first:
        deadline = time.monotonic() + 30
        while json.loads(path.read_text())["s"] < 0.2 and time.monotonic() < deadline:
            time.sleep(0.05)
        saved = json.loads(path.read_text())        # saved while it runs: a SIGTERM here keeps it
        assert 0.2 <= saved["s"] <= first.total_s() and saved["runs"] == 1
    stopped = json.loads(path.read_text())["s"]
    assert stopped >= saved["s"] and stopped == first.total_s()
    with SearchClock(path, every_s=0.05) as second:  # the run that finishes the search
        time.sleep(0.2)
    assert second.runs == 2 and second.total_s() >= stopped + 0.2
    assert json.loads(path.read_text()) == {"s": second.total_s(), "runs": 2}
    assert not list(tmp_path.glob("*.tmp"))
