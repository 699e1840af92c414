"""The guest helper's entry point: `python3 helper-<sha256>.pyz <command> --work <id> …`
runs this file from inside the zipapp, with the zipapp first on sys.path."""

import sys

from boxd_helper.cli import main

sys.exit(main(sys.argv[1:]))
