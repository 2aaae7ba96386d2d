#!/usr/bin/env bash
# Sets everything up, then runs the tests: fast unit tests first, then end-to-end and editor tests
# (the server over stdio, a headless Neovim, a headless VS Code), then the real default model.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/vscode-setup.sh  # a real VS Code (code-server) and chromium for the extension's tests
scripts/aider-setup.sh   # aider, a real OpenAI-API client, for the HTTP door's end-to-end test
if [ $# -eq 0 ]; then  # the whole run also lints and type-checks (a subset of tests, as asked, does not)
  .venv/bin/ruff check .
  .venv/bin/ruff format --check .
  scripts/typecheck.sh
fi
exec .venv/bin/python -m pytest "$@"
