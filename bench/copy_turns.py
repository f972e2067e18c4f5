"""Copy-heavy turns a coding agent really sends, as chat messages: rewrite a given file with one change, and
repeat a JSON document with one field changed. A real model answers them mostly by copying its prompt, which
is what prompt-lookup (ngram) speculation feeds on. `variant` makes each request's prompt distinct at its end only,
so a server's prefix cache serves the file from the first request on (prefill is not what these turns measure)."""

from __future__ import annotations

import json

SOURCE = '''import json
import os
from dataclasses import dataclass


@dataclass
class Record:
    name: str
    size: int
    tags: list[str]


def load_records(path):
    """Read every record of a JSON lines file."""
    records = []
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            data = json.loads(line)
            records.append(Record(data["name"], int(data["size"]), data.get("tags", [])))
    return records


def total_size(records):
    return sum(r.size for r in records)


def by_tag(records, tag):
    return [r for r in records if tag in r.tags]


def main():
    path = os.environ.get("RECORDS", "records.jsonl")
    records = load_records(path)
    print("records:", len(records))
    print("total size:", total_size(records))
    for r in by_tag(records, "large"):
        print(r.name, r.size)


if __name__ == "__main__":
    main()
'''


def rewrite_file(variant: int) -> str:
    """Ask for the whole file back with one function renamed."""
    return (f"Here is the file tools/records.py:\n\n```python\n{SOURCE}```\n\n"
            "Rename the function `total_size` to `sum_sizes` everywhere in this file. "
            f"Reply with the complete updated file only, in one ```python block. (request {variant})")


def document() -> dict:
    return {
        "id": "svc-7", "name": "inventory-api", "version": "2.3.1", "owner": "platform-team",
        "replicas": 3, "region": "eu-west-1",
        "resources": {"cpu": "500m", "memory": "512Mi"},
        "env": {"LOG_LEVEL": "info", "DB_HOST": "db.internal", "DB_PORT": "5432", "CACHE_TTL": "300"},
        "ports": [{"name": "http", "port": 8080}, {"name": "metrics", "port": 9090}],
        "labels": ["backend", "inventory", "critical"],
        "healthcheck": {"path": "/health", "interval_s": 10, "timeout_s": 2},
    }


def repeat_json(variant: int) -> str:
    """Ask for a JSON document back with one field changed."""
    doc = json.dumps(document(), indent=2)
    return (f"Here is a service description:\n\n```json\n{doc}\n```\n\n"
            "Change \"replicas\" to 5 and leave everything else exactly as it is. "
            f"Reply with the complete updated JSON document only. (request {variant})")


TURNS = {"rewrite file": rewrite_file, "repeat JSON": repeat_json}
