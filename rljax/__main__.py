from rljax.cli import entry

entry()
