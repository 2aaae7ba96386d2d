#!/usr/bin/env bash
# mypy --strict on engine/, drafters/ and lsp/. The folders install as specedit.* through a package-dir
# mapping that mypy cannot follow, so it checks a tree of links laid out as the installed package.
set -euo pipefail
cd "$(dirname "$0")/.."
tree=build/typecheck/specedit
rm -rf build/typecheck && mkdir -p "$tree"
for pair in engine:engine drafters:drafters lsp:lsp cli:editors/cli; do
    ln -s "$(pwd)/${pair#*:}" "$tree/${pair%%:*}"
done
cd build/typecheck
exec ../../.venv/bin/mypy --strict --follow-imports=silent --namespace-packages --explicit-package-bases \
    -p specedit.engine -p specedit.drafters -p specedit.lsp "$@"
