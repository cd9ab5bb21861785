"""Which of Spark's UI stages are one batch's: the listener's choice from REST answers (pure: the
answers are dicts as Spark's /api/v1 returns them, no UI running)."""

from __future__ import annotations

import io
import urllib.error

import pytest

from pipeline.listener import batch_stages

RUN = "5b0c8a8e-0000-4000-8000-000000000001"
OTHER_RUN = "5b0c8a8e-0000-4000-8000-000000000002"


def description(run_id: str, batch_id: int) -> str:
    """Spark's job description for a micro-batch (StreamExecution.getBatchDescriptionString)."""
    return f"\nid = 1f0e\nrunId = {run_id}\nbatch = {batch_id}"


def ui(jobs: list[dict], stages: dict[int, list[dict]]):
    def get_json(path: str):
        if path == "/jobs":
            return jobs
        stage_id = int(path.split("/")[2].split("?")[0])
        if stage_id not in stages:  # what Spark's UI answers for a stage it no longer keeps
            raise urllib.error.HTTPError(path, 404, "no such stage", {}, io.BytesIO())
        return stages[stage_id]
    return get_json


def test_a_batch_is_this_runs_jobs_only_and_a_stage_the_ui_dropped_is_skipped():
    jobs = [{"description": description(OTHER_RUN, 3), "status": "SUCCEEDED", "stageIds": [1, 2]},
            {"description": description(RUN, 3), "status": "SUCCEEDED", "stageIds": [7, 8, 9]},
            {"description": description(RUN, 13), "status": "SUCCEEDED", "stageIds": [20]}]
    stages = {2: [{"stageId": 2, "status": "COMPLETE"}], 8: [{"stageId": 8, "status": "COMPLETE"}],
              9: [{"stageId": 9, "status": "COMPLETE"}], 20: [{"stageId": 20, "status": "COMPLETE"}]}
    found, settled = batch_stages(ui(jobs, stages), RUN, 3)
    assert [s["stageId"] for s in found] == [8, 9]  # not stage 2 (another run's batch 3), not 20 (batch 13)
    assert settled


def test_a_batch_with_a_running_job_or_stage_is_not_settled_yet():
    jobs = [{"description": description(RUN, 4), "status": "RUNNING", "stageIds": [1]}]
    assert batch_stages(ui(jobs, {1: [{"stageId": 1, "status": "ACTIVE"}]}), RUN, 4) == ([], False)
    jobs = [{"description": description(RUN, 4), "status": "SUCCEEDED", "stageIds": [1, 2]}]
    stages = {1: [{"stageId": 1, "status": "COMPLETE"}], 2: [{"stageId": 2, "status": "SKIPPED"}]}
    assert batch_stages(ui(jobs, stages), RUN, 4)[1]


def test_an_error_other_than_a_dropped_stage_is_raised():
    def get_json(path: str):
        if path == "/jobs":
            return [{"description": description(RUN, 1), "status": "SUCCEEDED", "stageIds": [1]}]
        raise urllib.error.HTTPError(path, 500, "busy", {}, io.BytesIO())
    with pytest.raises(urllib.error.HTTPError):
        batch_stages(get_json, RUN, 1)
