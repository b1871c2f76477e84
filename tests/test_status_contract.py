"""The statuses the kernel writes into the panel's JSON are the ones the extension's TypeScript knows: Python's
enums (schema/status.py) and the unions of labextension/src/schema.ts list the same values."""

import json
import os
import re

from notebook_launcher.schema.status import RankStatus, RunStatus

SCHEMA_TS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "labextension", "src",
                         "schema.ts")


def union(name: str) -> set:
    with open(SCHEMA_TS) as source:
        text = source.read()
    body = re.search(rf"export type {name} =(.*?);", text, re.S).group(1)
    return set(re.findall(r"'([^']+)'", body))


def test_run_statuses_match_the_typescript_union():
    assert {status.value for status in RunStatus} == union("RunStatus")


def test_rank_statuses_match_the_typescript_union():
    assert {status.value for status in RankStatus} == union("RankStatus")


def test_a_status_is_its_string_in_json_and_text():
    assert json.dumps({"status": RunStatus.TIMED_OUT}) == '{"status": "timed out"}'
    assert f"{RunStatus.TIMED_OUT}" == "timed out" and str(RankStatus.IN_DDP) == "in DDP"
    assert RunStatus.FAILED == "failed"
