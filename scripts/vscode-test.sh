#!/usr/bin/env bash
# Runs the VS Code extension's tests (editors/vscode/src/test) in a real VS Code, headless, against the
# real specedit language server. Exit code: the tests' (0: all passed; 2: not set up; 124: timed out).
#
#   SPECEDIT_VSCODE_MODEL=<model folder> scripts/vscode-test.sh
#
# Environment:
#   SPECEDIT_VSCODE_MODEL          the model the server loads (required; the tests expect tests/conftest.py's
#                                  memorising model, as tests/test_vscode.py provides)
#   SPECEDIT_VSCODE_ENDLESS_MODEL  a model that never ends its answer, for the cancel test (skipped without)
#   SPECEDIT_VSCODE_PYTHON         the Python with specedit (default: .venv/bin/python)
#   SPECEDIT_VSCODE_GREP           run only the tests whose name matches
#   SPECEDIT_VSCODE_TIMEOUT        seconds for the whole run (default 300)
#   SPECEDIT_VSCODE_TRACE          off | messages | verbose: the LSP traffic, in the output on failure
#   SPECEDIT_VSCODE_CACHE          where scripts/vscode-setup.sh installed code-server (default build/vscode-headless)
#   SPECEDIT_VSCODE_SCREENSHOTS    where the tests' screenshots go (default build/screenshots; "" for none)
#   KEEP_RUN=1                     keep the run folder (logs, settings, workspace); kept anyway on failure
#
# Each run gets fresh user-data, extensions, workspace, HOME and XDG folders; code-server listens on
# 127.0.0.1 only; its process group (extension host and language server included) ends with the run.
set -uo pipefail
REPO="$(cd "$(dirname "$0")/.." && pwd)"
CACHE="${SPECEDIT_VSCODE_CACHE:-$REPO/build/vscode-headless}"
ENTRY="$CACHE/code-server-4.100.3/node_modules/code-server/out/node/entry.js"
EXT="$REPO/editors/vscode"
PYTHON="${SPECEDIT_VSCODE_PYTHON:-$REPO/.venv/bin/python}"
TIMEOUT="${SPECEDIT_VSCODE_TIMEOUT:-300}"
T0=$(date +%s)
log() { echo "[vscode-test +$(($(date +%s) - T0))s] $*" >&2; }

if [ ! -f "$ENTRY" ] || [ ! -d "$EXT/node_modules/vscode-languageclient" ]; then
    echo "vscode-test: not set up; run scripts/vscode-setup.sh first" >&2
    exit 2
fi
if [ -z "${SPECEDIT_VSCODE_MODEL:-}" ]; then
    echo "vscode-test: set SPECEDIT_VSCODE_MODEL to a model folder (tests/test_vscode.py does)" >&2
    exit 2
fi

log "building the extension and its tests"
(cd "$EXT" && node esbuild.mjs) || exit 1

RUN="$(mktemp -d "${TMPDIR:-/tmp}/specedit-vscode.XXXXXX")"
mkdir -p "$RUN/user-data/User" "$RUN/user-data/Machine" "$RUN/extensions" "$RUN/workspace" "$RUN/home" \
    "$RUN/xdg/config" "$RUN/xdg/data" "$RUN/xdg/cache"
# code-server (config, logs), chromium (profile, crash reports) and the server's caches stay in the run.
export HOME="$RUN/home" XDG_CONFIG_HOME="$RUN/xdg/config" XDG_DATA_HOME="$RUN/xdg/data" XDG_CACHE_HOME="$RUN/xdg/cache"
export SPECEDIT_VSCODE_ENDLESS_MODEL="${SPECEDIT_VSCODE_ENDLESS_MODEL:-}" SPECEDIT_VSCODE_GREP="${SPECEDIT_VSCODE_GREP:-}"
export SPECEDIT_VSCODE_SCREENSHOTS="${SPECEDIT_VSCODE_SCREENSHOTS-$REPO/build/screenshots}"

cat > "$RUN/user-data/User/settings.json" <<EOF
{
  "security.workspace.trust.enabled": false,
  "workbench.startupEditor": "none",
  "telemetry.telemetryLevel": "off",
  "extensions.autoCheckUpdates": false,
  "extensions.autoUpdate": false,
  "update.mode": "none",
  "workbench.tips.enabled": false,
  "workbench.enableExperiments": false,
  "files.autoSave": "off",
  "specedit.trace.server": "${SPECEDIT_VSCODE_TRACE:-off}"
}
EOF
# code-server's window is a remote one: machine-scoped settings (the server command) are read from the
# remote machine's settings, not the user's.
python3 - "$RUN/user-data/Machine/settings.json" "$PYTHON" "$SPECEDIT_VSCODE_MODEL" <<'EOF'
import json, sys
path, python, model = sys.argv[1:]
command = [python, "-m", "specedit.lsp", "--engine", "inprocess", "--model", model, "--dtype", "float32", "--threads", "1"]
json.dump({"specedit.server.command": command}, open(path, "w"), indent=2)
EOF

PIDS=()
cleanup() {
    for pid in "${PIDS[@]}"; do kill -TERM -- "-$pid" 2>/dev/null; done
    for pid in "${PIDS[@]}"; do
        for _ in $(seq 1 50); do kill -0 -- "-$pid" 2>/dev/null || break; sleep 0.1; done
        kill -KILL -- "-$pid" 2>/dev/null
    done
    if [ "${KEEP_RUN:-0}" = 1 ]; then log "run folder kept: $RUN"; else rm -rf "$RUN"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

PORT=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
log "starting code-server on 127.0.0.1:$PORT"
EXTENSIONS_GALLERY='{}' setsid node "$ENTRY" --config "$RUN/config.yaml" --user-data-dir "$RUN/user-data" \
    --extensions-dir "$RUN/extensions" --bind-addr "127.0.0.1:$PORT" --auth none --disable-telemetry \
    --disable-update-check --disable-workspace-trust --disable-getting-started-override "$RUN/workspace" \
    >"$RUN/code-server.log" 2>&1 &
PIDS+=($!)
for _ in $(seq 1 150); do
    curl -fs -o /dev/null "http://127.0.0.1:$PORT/healthz" && break
    kill -0 "${PIDS[0]}" 2>/dev/null || break
    sleep 0.2
done
if ! curl -fs -o /dev/null "http://127.0.0.1:$PORT/healthz"; then
    log "code-server did not come up"; cat "$RUN/code-server.log" >&2; KEEP_RUN=1; exit 1
fi

log "running the tests in the extension host"
# The driver in its own process group too (chromium is its child); `timeout` in case it hangs. Its
# output (the tests' console) is shown as it comes, without code-server's routine lines.
NOISE='Creating a socket|connection token|Ignoring fetching additional builtin|Updating additional builtin|Service Worker\] registered|ChatSessionStore'
setsid timeout -k 10 "$((TIMEOUT + 30))" node "$EXT/test-harness/drive.js" "http://127.0.0.1:$PORT" "$RUN/workspace" \
    "$EXT" "$EXT/dist/test/index.js" > >(grep --line-buffered -v -E "$NOISE") 2>&1 &
PIDS+=($!)
wait "${PIDS[1]}"
RC=$?

if [ "$RC" = 0 ]; then
    log "passed"
else
    log "FAILED ($RC); code-server's log:"
    tail -n 60 "$RUN/code-server.log" >&2
    for f in $(find "$RUN/user-data/logs" -name '*specedit*' 2>/dev/null); do log "$f:"; tail -n 80 "$f" >&2; done
    KEEP_RUN=1
fi
exit "$RC"
