#!/usr/bin/env bash
# Installs what the VS Code extension and its tests need: the extension's node packages
# (editors/vscode/node_modules, from package-lock.json) and a real VS Code to test in, headless.
#
# VS Code itself cannot be downloaded here (@vscode/test-electron fetches it from Microsoft), but npm's
# code-server 4.100.3 bundles VS Code 1.100.3 (the last code-server whose engines.node is 20). Its
# post-install downloads from GitHub twice, so it is replayed by hand: ripgrep comes from Debian (a link
# at @vscode/ripgrep/bin/rg makes that package's post-install skip its download) and argon2 is built from
# source. Debian's chromium, driven by playwright-core (an extension devDependency), opens the workbench.
#
# Everything goes under $SPECEDIT_VSCODE_CACHE (default: build/vscode-headless, ignored by git).
# Idempotent: a second run only checks (about 1 s). FRESH=1 reinstalls code-server. Reaches apt and the
# npm registry only. About 2-4 minutes from scratch on 2 cores; ~650 MB.
set -euo pipefail
REPO="$(cd "$(dirname "$0")/.." && pwd)"
CACHE="${SPECEDIT_VSCODE_CACHE:-$REPO/build/vscode-headless}"
CODE_SERVER_VERSION=4.100.3
EXT="$REPO/editors/vscode"
T0=$(date +%s)
log() { echo "[vscode-setup +$(($(date +%s) - T0))s] $*" >&2; }

# ------------------------------------------------------------------------------------------- apt
# chromium drives the workbench; ripgrep stands in for @vscode/ripgrep's download; the -dev packages
# and build-essential build code-server's native modules (node-pty, kerberos, native-keymap, ...).
missing=()
for package in chromium ripgrep build-essential pkg-config python3 libkrb5-dev libx11-dev libxkbfile-dev libsecret-1-dev; do
    dpkg -s "$package" >/dev/null 2>&1 || missing+=("$package")
done
if [ ${#missing[@]} -gt 0 ]; then
    SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
    log "apt-get install ${missing[*]}"
    # apt checks the lists' signatures as the user _apt, with a temporary file in TMPDIR (or /tmp); where
    # _apt cannot write there (a CI run's /tmp once: "Couldn't create temporary file /tmp/apt.conf.*"),
    # the update fails with exit 100. Then again as root, in a folder of our own, and, failing that, on
    # the lists the machine already has.
    apt_tmp="$CACHE/apt-tmp"
    if ! $SUDO apt-get update -qq; then
        log "apt-get update failed; again as root with TMPDIR=$apt_tmp"
        mkdir -p "$apt_tmp"
        $SUDO env TMPDIR="$apt_tmp" apt-get -o APT::Sandbox::User=root update -qq \
            || log "apt-get update failed again; installing from the package lists already here"
    fi
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
command -v node >/dev/null || { echo "vscode-setup: Node.js 20 is needed (apt-get install nodejs npm)" >&2; exit 1; }
case "$(node --version)" in v20.*|v22.*) ;; *) log "warning: code-server $CODE_SERVER_VERSION wants Node 20; this is $(node --version)";; esac

export npm_config_fund=false npm_config_audit=false npm_config_update_notifier=false npm_config_loglevel=error
export npm_config_yes=true                 # node-pty's install runs `npx node-gyp`
[ -f /usr/include/node/node.h ] && export npm_config_nodedir=/usr   # node-gyp: local headers, no download
export PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1
# npm and node-gyp write caches and logs under HOME/XDG: keep them in the cache folder.
mkdir -p "$CACHE/xdg"
export XDG_CONFIG_HOME="$CACHE/xdg/config" XDG_DATA_HOME="$CACHE/xdg/data" XDG_CACHE_HOME="$CACHE/xdg/cache"

# ------------------------------------------------------------------------------- the extension's deps
if [ ! -f "$EXT/node_modules/.package-lock.json" ] || [ "$EXT/package-lock.json" -nt "$EXT/node_modules/.package-lock.json" ]; then
    log "npm ci in editors/vscode"
    (cd "$EXT" && npm ci --no-audit --no-fund >/dev/null)
fi

# ---------------------------------------------------------------------------------------- code-server
CS="$CACHE/code-server-$CODE_SERVER_VERSION"
VS="$CS/node_modules/code-server/lib/vscode"
if [ "${FRESH:-0}" = 1 ]; then
    log "FRESH=1: removing $CS"
    rm -rf "$CS"
fi
if [ ! -f "$CS/.installed" ]; then
    mkdir -p "$CS"
    if [ ! -f "$CS/node_modules/code-server/package.json" ]; then
        log "npm install code-server@$CODE_SERVER_VERSION --ignore-scripts"
        (cd "$CS" && echo '{"private": true}' > package.json && npm install --ignore-scripts "code-server@$CODE_SERVER_VERSION" >/dev/null)
    fi
    if ! (cd "$CS/node_modules/code-server" && node -e "require('argon2')" 2>/dev/null); then
        log "argon2 from source (its install would fetch a prebuilt binary from GitHub)"
        (cd "$CS" && npm_config_build_from_source=true npm rebuild argon2 --foreground-scripts >"$CS/argon2.log" 2>&1) \
            || { tail -30 "$CS/argon2.log" >&2; exit 1; }
    fi
    # code-server's postinstall.sh, by hand, minus the ripgrep download.
    if [ ! -f "$VS/node_modules/@vscode/spdlog/build/Release/spdlog.node" ]; then
        log "lib/vscode: npm install --omit=dev --ignore-scripts"
        (cd "$VS" && npm install --omit=dev --ignore-scripts >/dev/null)
        mkdir -p "$VS/node_modules/@vscode/ripgrep/bin"
        ln -sfn "$(command -v rg)" "$VS/node_modules/@vscode/ripgrep/bin/rg"
        log "lib/vscode: npm rebuild (native modules; the slow part)"
        (cd "$VS" && npm rebuild >"$CS/rebuild.log" 2>&1) || { tail -40 "$CS/rebuild.log" >&2; exit 1; }
    fi
    ln -sfn node_modules "$VS/node_modules.asar"
    (cd "$VS/bin/remote-cli" && ln -sfn code-linux.sh code-server)
    (cd "$VS/bin/helpers" && ln -sfn browser-linux.sh browser.sh)
    node "$CS/node_modules/code-server/out/node/entry.js" --version >/dev/null
    touch "$CS/.installed"
fi

log "ready: $(node "$CS/node_modules/code-server/out/node/entry.js" --version | head -1 | cut -d' ' -f1) (code-server), $(chromium --version 2>/dev/null | cut -d' ' -f2) (chromium), in $CACHE"
