"""Write tests/durations.json, the seconds each test file took, from a suite log with durations.

  bash scripts/test.sh --durations=0 > suite.log; python scripts/test_durations.py suite.log

tests/conftest.py starts the longest files first, so that under ``--dist loadfile`` no long file
is left to run alone on one core at the end. Only the order depends on these figures.
"""
import collections
import json
import os
import re
import sys

LINE = re.compile(r"\s*([\d.]+)s (?:call|setup|teardown)\s+(tests/\S+?\.py)::")
OUT = os.path.join(os.path.dirname(__file__), "..", "tests", "durations.json")


def file_seconds(lines) -> dict:
  seconds = collections.Counter()
  for line in lines:
    if match := LINE.match(line):
      seconds[match.group(2)] += float(match.group(1))
  return {name: round(s, 1) for name, s in sorted(seconds.items())}


if __name__ == "__main__":
  with open(sys.argv[1]) as log:
    found = file_seconds(log)
  if not found:
    sys.exit(f"{sys.argv[1]}: no test durations in it (run the suite with --durations=0)")
  with open(OUT, "w") as f:
    json.dump(found, f, indent=0, sort_keys=True)
    f.write("\n")
  print(f"{len(found)} files, {sum(found.values()):.0f} s -> {os.path.normpath(OUT)}")
