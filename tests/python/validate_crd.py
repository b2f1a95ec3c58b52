"""Validates rendered Kubernetes objects of custom kinds against the
OpenAPI v3 schemas of their CustomResourceDefinitions, offline, as the API
server would with kubectl's default strict field validation: a field the
schema does not name is an error (except where the schema keeps unknown
fields, x-kubernetes-preserve-unknown-fields), as is a missing required
field or a value of the wrong type.

usage: validate_crd.py --crd CRD.yaml [--crd ...] OBJECTS.yaml

Prints one line per object validated; exits 1 naming every problem, or
when an object's kind has no CRD given.
"""

import argparse
import sys

import jsonschema
import yaml


def strict(schema):
    """The schema with unknown fields refused where it names its fields."""
    if isinstance(schema, dict):
        schema = {k: strict(v) for k, v in schema.items()}
        if (
            "properties" in schema
            and "additionalProperties" not in schema
            and not schema.get("x-kubernetes-preserve-unknown-fields")
        ):
            schema["additionalProperties"] = False
        if schema.get("x-kubernetes-int-or-string"):
            schema.pop("type", None)
            schema["anyOf"] = [{"type": "integer"}, {"type": "string"}]
        if schema.get("nullable"):
            kind = schema.get("type")
            if isinstance(kind, str):
                schema["type"] = [kind, "null"]
        return schema
    if isinstance(schema, list):
        return [strict(s) for s in schema]
    return schema


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--crd", action="append", required=True)
    parser.add_argument("objects")
    args = parser.parse_args()
    schemas = {}
    for path in args.crd:
        with open(path) as f:
            crd = yaml.safe_load(f)
        group = crd["spec"]["group"]
        kind = crd["spec"]["names"]["kind"]
        for version in crd["spec"]["versions"]:
            if version.get("served"):
                schema = strict(version["schema"]["openAPIV3Schema"])
                schemas[(f"{group}/{version['name']}", kind)] = schema
    problems = []
    with open(args.objects) as f:
        objects = [o for o in yaml.safe_load_all(f) if o]
    checked = 0
    for obj in objects:
        key = (obj.get("apiVersion"), obj.get("kind"))
        if key[0] in ("v1",) or "." not in (key[0] or "").split("/")[0]:
            continue  # a built-in kind: kubernetes-validate's job
        name = f"{key[1]} {obj.get('metadata', {}).get('name')}"
        schema = schemas.get(key)
        if schema is None:
            problems.append(f"{name}: no CRD given for {key[0]} {key[1]}")
            continue
        validator = jsonschema.Draft7Validator(schema)
        errors = sorted(validator.iter_errors(obj), key=lambda e: list(e.absolute_path))
        for e in errors:
            path = "/".join(str(p) for p in e.absolute_path)
            problems.append(f"{name}: {path}: {e.message}")
        checked += 1
        print(f"{name}: {'valid' if not errors else 'INVALID'} against {key[0]}")
    if problems:
        print("\n".join(problems))
        sys.exit(1)
    if checked == 0:
        print("no object of a custom kind")
        sys.exit(1)


if __name__ == "__main__":
    main()
