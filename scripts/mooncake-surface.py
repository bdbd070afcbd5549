#!/usr/bin/python3
"""Record the `mooncake.engine` surface of a Mooncake release's type stub
(`mooncake/engine.pyi`) as JSON: module constants, aliases, functions and
classes, each method's parameters (name, kind, default, annotation) and
return annotation. Names and signatures only; no code of the stub is
copied. The golden tests/python/mooncake_0314_surface.json was made with it;
tests/python/test_mooncake_0314_surface.py checks the drop-in against it.

    pip download mooncake-transfer-engine-cuda13==0.3.14 --no-deps -d DIR
    unzip -o DIR/*.whl mooncake/engine.pyi -d DIR
    scripts/mooncake-surface.py DIR/mooncake/engine.pyi \\
        --package mooncake-transfer-engine-cuda13 --version 0.3.14 \\
        --wheel DIR/*.whl > tests/python/mooncake_0314_surface.json
"""

import argparse
import ast
import hashlib
import json
import os
import sys


def _src(node):
    return None if node is None else ast.unparse(node)


def _default(node):
    """A literal default as JSON ({"value": ...}), else its source text."""
    try:
        return {"value": ast.literal_eval(node)}
    except ValueError:
        return {"expr": ast.unparse(node)}


def params(fn, skip_self):
    a = fn.args
    out = []
    positional = [(p, "positional_only") for p in a.posonlyargs] + \
                 [(p, "positional_or_keyword") for p in a.args]
    defaults = [None] * (len(positional) - len(a.defaults)) + list(a.defaults)
    for (p, kind), d in zip(positional, defaults):
        out.append({"name": p.arg, "kind": kind, "annotation": _src(p.annotation),
                    **({"default": _default(d)} if d is not None else {})})
    if a.vararg:
        out.append({"name": a.vararg.arg, "kind": "var_positional",
                    "annotation": _src(a.vararg.annotation)})
    for p, d in zip(a.kwonlyargs, a.kw_defaults):
        out.append({"name": p.arg, "kind": "keyword_only", "annotation": _src(p.annotation),
                    **({"default": _default(d)} if d is not None else {})})
    if a.kwarg:
        out.append({"name": a.kwarg.arg, "kind": "var_keyword",
                    "annotation": _src(a.kwarg.annotation)})
    if skip_self and out and out[0]["name"] in ("self", "cls"):
        out = out[1:]
    return out


def function(fn, in_class):
    decos = [_src(d) for d in fn.decorator_list]
    static = "staticmethod" in decos
    return {"params": params(fn, in_class and not static), "returns": _src(fn.returns),
            "decorators": decos, "has_docstring": ast.get_docstring(fn) is not None}


def klass(node):
    out = {"methods": {}, "properties": {}, "attributes": {}, "aliases": {}}
    for item in node.body:
        if isinstance(item, ast.FunctionDef):
            f = function(item, True)
            if "property" in f["decorators"]:
                out["properties"][item.name] = f["returns"]
            elif "overload" in f["decorators"]:
                out["methods"].setdefault(item.name, {"overloads": []})
                out["methods"][item.name]["overloads"].append(f)
            else:
                out["methods"][item.name] = f
        elif isinstance(item, ast.AnnAssign):
            out["attributes"][item.target.id] = _src(item.annotation)
        elif isinstance(item, ast.Assign):
            for t in item.targets:
                out["aliases"][t.id] = _src(item.value)
    return out


def surface(path):
    tree = ast.parse(open(path, encoding="utf-8").read())
    mod = {"constants": {}, "aliases": {}, "functions": {}, "classes": {}}
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            mod["classes"][node.name] = klass(node)
        elif isinstance(node, ast.FunctionDef):
            mod["functions"][node.name] = function(node, False)
        elif isinstance(node, ast.AnnAssign):
            mod["constants"][node.target.id] = _src(node.annotation)
        elif isinstance(node, ast.Assign):
            for t in node.targets:
                mod["aliases"][t.id] = _src(node.value)
    return mod


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("pyi")
    ap.add_argument("--package", required=True)
    ap.add_argument("--version", required=True)
    ap.add_argument("--wheel", help="the wheel the stub came from (its name and sha256)")
    a = ap.parse_args()
    source = {"package": a.package, "version": a.version, "file": "mooncake/engine.pyi",
              "sha256": hashlib.sha256(open(a.pyi, "rb").read()).hexdigest()}
    if a.wheel:
        source["wheel"] = os.path.basename(a.wheel)
        source["wheel_sha256"] = hashlib.sha256(open(a.wheel, "rb").read()).hexdigest()
    out = {"source": source,
           "note": "names, parameters, defaults and annotations of the stub, recorded by "
                   "scripts/mooncake-surface.py; no code of the stub",
           "module": surface(a.pyi)}
    json.dump(out, sys.stdout, indent=1, sort_keys=False)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
