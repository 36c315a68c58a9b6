#!/usr/bin/env python3
"""Validates infoflow_sp result files against docs/result.schema.json (JSON Schema draft-07,
python3-jsonschema from Debian, installed by launch/setup.sh).

  validate_result.py SCHEMA RESULT.json [...]        every result against the whole schema
  validate_result.py SCHEMA --rows JOB ROWS.jsonl     every line against JOB's row schema

Exits 1 naming the file, line and the failing field path on the first invalid document."""
import json
import sys

import jsonschema


def fail(msg):
    print(f"FAIL: {msg}")
    sys.exit(1)


def check(schema, doc, where):
    validator = jsonschema.Draft7Validator(schema)
    errors = sorted(validator.iter_errors(doc), key=lambda e: list(e.absolute_path))
    if errors:
        e = errors[0]
        path = "/".join(str(p) for p in e.absolute_path) or "<root>"
        fail(f"{where}: {path}: {e.message}")


def main(argv):
    schema = json.load(open(argv[1]))
    jsonschema.Draft7Validator.check_schema(schema)
    if argv[2] == "--rows":
        job, path = argv[3], argv[4]
        key = {"niah": "niah", "eval": "eval"}[job]
        row_schema = dict(schema["definitions"][key]["properties"]["rows"]["items"])
        row_schema["definitions"] = schema["definitions"]
        n = 0
        with open(path) as f:
            for n, line in enumerate(f, 1):
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as e:
                    fail(f"{path}:{n}: not JSON ({e})")
                check(row_schema, row, f"{path}:{n}")
        print(f"ok: {path}: {n} rows valid")
        return
    for path in argv[2:]:
        check(schema, json.load(open(path)), path)
        print(f"ok: {path} valid (schema_version 1)")


if __name__ == "__main__":
    main(sys.argv)
