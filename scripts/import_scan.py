"""Import scan of the ``rljax`` package: circles, imports that run up the layers, local imports.

  python scripts/import_scan.py [--root DIR] [--json]

Reads every ``rljax/**/*.py`` with the standard library's ``ast`` (nothing is imported or run)
and prints three lists:

- circles: groups of modules that import each other (module-level and function-local imports
  alike: a function-local import is still a dependency);
- upward imports: a module importing one of a higher layer;
- function-local imports: an ``import`` inside a function or class body.

The layers (the project's design: config < models < rollout < rewards/data/parallel < algos <
transforms/envs < learner < loading < train < api/cli), with the top-level modules placed among them (a key names a
room or one module of it, the longer name winning):

  0 base        config, registries, errors, lifetime    the key declarations, the registries
                                                        (filled by module path when read) and
                                                        errors: they import nothing of the
                                                        package above them
  1 models
  2 rollout, vision                                     vision: the image towers and vision
                                                        families around the one network
  3 rewards, data, parallel
  4 algos
  5 transforms, envs, runs                              runs: what a run directory is
  6 algorithm                                           the resolved algorithm
    agents                                              the agent endpoint, harnesses, sandbox
  7 learner                                             the compiled update
  8 loading                                             every model a run reads, by role
                                                        (the source grammar: config.sources)
  9 train
 10 api, cli, catalogue, plan, sweep, __init__, __main__   what users call
"""
from __future__ import annotations

import argparse
import ast
import json
import os
import sys

LAYERS = {
    "config": 0, "registries": 0, "errors": 0, "lifetime": 0,
    "models": 1,
    "rollout": 2, "vision": 2,
    "rewards": 3, "data": 3, "parallel": 3,
    "algos": 4,
    "transforms": 5, "envs": 5, "runs": 5,
    "algorithm": 6, "agents": 6,
    "learner": 7,
    "loading": 8,
    "train": 9,
    "api": 10, "cli": 10, "catalogue": 10, "plan": 10, "plan_rewards": 10, "plan_vision": 10,
    "sweep": 10,
    "__init__": 10, "__main__": 10,
}


def modules(root: str) -> dict:
  """``{dotted module name: file path}`` of every file of the package under ``root``."""
  found = {}
  for folder, _, files in os.walk(os.path.join(root, "rljax")):
    for name in files:
      if name.endswith(".py"):
        path = os.path.join(folder, name)
        parts = os.path.relpath(path, root)[:-3].split(os.sep)
        if parts[-1] == "__init__":
          parts = parts[:-1]
        found[".".join(parts)] = path
  return found


def layer(module: str) -> int:
  parts = module.split(".")[1:] or ["__init__"]
  for n in range(len(parts), 0, -1):
    if ".".join(parts[:n]) in LAYERS:
      return LAYERS[".".join(parts[:n])]
  raise SystemExit(f"import_scan: rljax.{parts[0]} has no layer: add it to LAYERS")


def _targets(node, module: str, is_package: bool, known: dict) -> list:
  """The package's modules an import statement names."""
  if isinstance(node, ast.Import):
    return [a.name for a in node.names if a.name in known]
  base = node.module or ""
  if node.level:  # a relative import
    anchor = module.split(".") if is_package else module.split(".")[:-1]
    anchor = anchor[:len(anchor) - node.level + 1]
    base = ".".join(anchor + ([base] if base else []))
  out = []
  for alias in node.names:
    if f"{base}.{alias.name}" in known:
      out.append(f"{base}.{alias.name}")  # ``from rljax import config_checks``: the module
    elif base in known:
      out.append(base)
  return out


def scan(root: str) -> dict:
  known = modules(root)
  edges, local = {}, []
  for module, path in sorted(known.items()):
    with open(path, encoding="utf-8") as f:
      tree = ast.parse(f.read(), path)
    is_package = path.endswith("__init__.py")
    edges[module] = {}
    functions = [n for n in ast.walk(tree)
                 if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))]
    nested = {id(n) for fn in functions for n in ast.walk(fn) if n is not fn}
    for node in ast.walk(tree):
      if not isinstance(node, (ast.Import, ast.ImportFrom)):
        continue
      is_local = id(node) in nested
      names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
          [("." * node.level) + (node.module or "")]
      if is_local:
        local.append({"module": module, "line": node.lineno, "imports": names[0]})
      for target in _targets(node, module, is_package, known):
        if target != module:
          edges[module].setdefault(target, node.lineno)
  upward = [{"module": m, "line": line, "imports": t, "from_layer": layer(m), "to_layer": layer(t)}
            for m, targets in edges.items() for t, line in targets.items()
            if layer(t) > layer(m)]
  return {"circles": circles(edges), "upward": upward, "local": local}


def circles(edges: dict) -> list:
  """Strongly connected components of more than one module (Tarjan), each sorted."""
  index, low, stack, on_stack, found = {}, {}, [], set(), []
  counter = [0]

  def visit(v):
    index[v] = low[v] = counter[0]
    counter[0] += 1
    stack.append(v)
    on_stack.add(v)
    for w in edges.get(v, ()):
      if w not in index:
        visit(w)
        low[v] = min(low[v], low[w])
      elif w in on_stack:
        low[v] = min(low[v], index[w])
    if low[v] == index[v]:
      group = []
      while True:
        w = stack.pop()
        on_stack.discard(w)
        group.append(w)
        if w == v:
          break
      if len(group) > 1:
        found.append(sorted(group))

  sys.setrecursionlimit(10000)
  for v in sorted(edges):
    if v not in index:
      visit(v)
  return sorted(found)


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--root", default=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  parser.add_argument("--json", action="store_true", help="print the result as JSON")
  args = parser.parse_args(argv)
  result = scan(args.root)
  if args.json:
    print(json.dumps(result, indent=1))
    return 0
  print(f"circles: {len(result['circles'])}")
  for group in result["circles"]:
    print("  " + " <-> ".join(group))
  print(f"upward imports: {len(result['upward'])}")
  for u in result["upward"]:
    print(f"  {u['module']}:{u['line']} (layer {u['from_layer']}) -> {u['imports']} "
          f"(layer {u['to_layer']})")
  print(f"function-local imports: {len(result['local'])}")
  for entry in result["local"]:
    print(f"  {entry['module']}:{entry['line']} {entry['imports']}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
