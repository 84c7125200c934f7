#!/usr/bin/env bash
# The GPU list of issues 13, 23 and 46 (docs/performance.md records its figures), in three long commands for a
# machine lent for a short while: every step runs even when an earlier one fails, and each writes
# its log under $OUT (at most 8 files come back from the device tool).
#
#   bash benchmarks/gpu_session.sh tests    # CUDA kernel tests, >= 1e9 elements per dtype CPU == GPU,
#                                           # init_module_ on CUDA (transformers), then the native
#                                           # stacks on CUDA (issue 46: a torchtitan Llama 3 and a
#                                           # Megatron-Core GPTModel == their CPU bytes, the GPTModel's
#                                           # forward loss at init ~ ln V), the service's CUDA cases, then
#                                           # the Triton interpreter's tests (> 10 min in all: give the
#                                           # interpreter step a call of its own if needed)
#   bash benchmarks/gpu_session.sh bench    # engine_gpu, init_module_ of a Llama-3-8B shape on the GPU
#                                           # against transformers' init, end to end (~8 min)
#   bash benchmarks/gpu_session.sh list     # issue 56's list in one call (~8 min on an H200, each step under a
#                                           # timeout): the identity tests (GPU kernel, init_module_ on CUDA for
#                                           # transformers, torchtitan and Megatron-Core models, the service's CUDA
#                                           # case) in parallel workers, then, alone, llama-3-8b embedded against
#                                           # its floor and served by `modelinit serve --device cuda` against the
#                                           # raw gRPC ceiling (first request and repeat apart)
#   bash benchmarks/gpu_session.sh floor    # the embedded job with --device cuda against its floor, tinyllama
#                                           # and llama-3-8b; llama-3-8b served and embedded; llama-3-8b
#                                           # embedded with --parallel 1, 4 and the default (~10 min)
#
# The device machine has no network and its own torch (CUDA) and triton: the project installs with
# --no-deps. Wheels its image lacks go in .whl/ (git-ignored, carried), e.g. for Python 3.12:
#   pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
#     -d .whl grpcio-health-checking==1.85.1 grpcio-reflection==1.85.1 grpcio==1.85.1 protobuf==7.36.2 \
#     transformers==5.24.0 tokenizers==0.23.3 crc32c==2.9.post0 megatron-core==0.16.1 \
#     tyro==1.0.17 docstring-parser==0.18.0 typeguard==4.6.1 typing-extensions==4.16.0 spmd_types==0.2.3
# (the image has numba, safetensors, hypothesis, prometheus-client, ml-dtypes, pytest-xdist, pytest-timeout, an
# older transformers and huggingface-hub 1.33, which transformers 5.24 accepts: do not carry huggingface-hub 2.x,
# it imports httpx2, which the image lacks, and every transformers test then skips).
# megatron-core 0.16.1 requires torch, numpy and packaging (the image's; add packaging>=24.2 if it lacks it); its wheel is per Python version
# (cp312, a C++ helper of its datasets), the rest pure Python: tyro (with docstring-parser, typeguard and
# typing-extensions >= 4.14) and spmd_types are what torchtitan's models import. torchtitan itself is the
# tests/.stacks folder the CPU tests install (pip --target; tests/support/stacks.py): run the tests stage
# with carry [".whl", "tests/.stacks/torchtitan"] (12 MB; the whole tests/.stacks, mup's pandas included, is
# over the run tool's 64 MiB; where tests/.stacks is a link to another checkout, carry a real copy).
# Without them the stacks step's tests skip (-rs says why); the script itself needs neither.
# Transformer Engine (its wheel, about 276 MB, is over what a run carries) is the image's where it has one:
# machine.txt says which; with it, test_stacks_cuda.py builds Megatron's Transformer Engine layer spec and
# TEGroupedMLP experts on the GPU and compares them with the CPU bytes (what lets
# training/megatron/refusals.py's TE_LAYER_SPEC_VERIFIED and TE_GROUPED_EXPERTS_VERIFIED be set); without
# it those two tests skip.
set -u
stage=${1:-tests}
OUT=${OUT:-/tmp/modelinit-gpu}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
# That image's site-packages hold no bytecode and are read-only: every process compiled ~1000 modules
# (2.8 s of each job's start, torch's import alone 4.4 s). Bytecode goes to a writable prefix instead,
# so only the first process pays, as on an image that ships it.
unset PYTHONDONTWRITEBYTECODE
export PYTHONPYCACHEPREFIX=${PYTHONPYCACHEPREFIX:-/tmp/modelinit-pycache}
PY=${PYTHON:-python3}
cd "$(dirname "$0")/.."

if ls .whl/*.whl >/dev/null 2>&1; then
    rm -rf /tmp/site  # a warm machine keeps the last call's: pip --target --upgrade removes no wheel dropped since
    $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONPATH=$PWD/server:$PWD/client:$PWD/proto${PYTHONPATH:+:$PYTHONPATH}  # the checkout itself, no install step

step() {  # step NAME COMMAND...: run it, its output into $OUT/NAME.txt and on the console
    echo "=== $1: ${*:2}" | tee "$OUT/$1.txt"
    "${@:2}" 2>&1 | tee -a "$OUT/$1.txt"
    echo "=== $1: exit ${PIPESTATUS[0]}" | tee -a "$OUT/$1.txt"
}

timed_step() {  # timed_step NAME SECONDS COMMAND...: step, stopped after SECONDS (exit 124), so one hung step leaves time to the rest
    step "$1" timeout -k 10 "${@:2}"
}

{ nvidia-smi; $PY -c "import torch, triton; print(torch.__version__, torch.version.cuda, triton.__version__)"; nproc
  $PY -c "import transformer_engine as te; print('transformer_engine', te.__version__)" 2>/dev/null \
    || echo "no transformer_engine"; } > "$OUT/machine.txt" 2>&1
case "$stage" in
tests)
    # The GPU's own tests first; Triton's CPU interpreter tests (minutes) last.
    step kernel $PY -m pytest -q -rs tests/server/engine/test_kernel_cuda.py -k "gpu or ptx or one_run"
    step training $PY -m pytest -q -rs tests/server/training/test_init_module.py -k "cuda or equals_files or every_family"
    step stacks $PY -m pytest -q -rs tests/server/training/test_stacks_cuda.py
    step service $PY -m pytest -q -rs tests/server/service/test_service.py -k cuda
    step interpreter $PY -m pytest -q -rs tests/server/engine/test_kernel_cuda.py -k "not (gpu or ptx or one_run)"
    ;;
list)
    # The identity tests in 8 workers (the random table in 8 parts: on 2026-11-28, in one test, it outlasted 190 s of
    # Triton compiles beside the rest); the figures after them, alone (on an H200 node: identity ~3.5 min, floor
    # ~1 min, served ~2.5 min).
    # -v: each result as it comes (a step stopped at its timeout still says what passed); pytest-timeout (the
    # image has it) fails one hung test with its stack and lets the run print its summary.
    timeout_flag=$($PY -c "import pytest_timeout" 2>/dev/null && echo "--timeout 200")
    timed_step identity 260 $PY -m pytest -v --tb=short -rfEs $timeout_flag -n 8 -p no:cacheprovider \
        tests/server/engine/test_kernel_cuda.py::test_gpu_golden tests/server/engine/test_kernel_cuda.py::test_gpu_random_table \
        tests/server/engine/test_kernel_cuda.py::test_gpu_ptx_for_this_device tests/server/engine/test_kernel_cuda.py::test_gpu_billion_elements \
        tests/server/engine/test_kernel_cuda.py::test_gpu_slices_concatenate tests/server/engine/test_kernel_cuda.py::test_gpu_several_threads_at_once \
        tests/server/engine/test_kernel_cuda.py::test_ptx_constants_are_exact_float64 \
        tests/server/training/test_stacks_cuda.py tests/server/training/test_init_module.py::test_cuda_module_equals_files \
        tests/server/training/test_init_module.py::test_cuda_dtensors_of_a_world_of_one_equal_files \
        tests/server/service/test_service.py -k "cuda or gpu or ptx or test_stacks_cuda"
    timed_step floor_8b 120 $PY benchmarks/floor.py --model llama-3-8b --device cuda --reps 1 --json "$OUT/floor_8b.json"
    timed_step served_8b 230 $PY benchmarks/end_to_end.py --model llama-3-8b --device cuda --reps 2 --hf-reps 0
    ;;
bench)
    step engine_gpu $PY benchmarks/engine_gpu.py
    step init_module_8b $PY benchmarks/init_module.py --shape llama-3-8b --device cuda --repeat 3
    step end_to_end $PY benchmarks/end_to_end.py --reps 2 --hf-reps 1
    ;;
floor)
    step floor_tinyllama $PY benchmarks/floor.py --device cuda --reps 3 --json "$OUT/floor_tinyllama.json"
    step floor_8b $PY benchmarks/floor.py --model llama-3-8b --device cuda --reps 2 --json "$OUT/floor_8b.json"
    step end_to_end_8b $PY benchmarks/end_to_end.py --model llama-3-8b --reps 1 --hf-reps 0
    # N files at once, each its own SHA-256: where one file's hash bounds the job (16 cores, a GPU)
    # (auto: no --parallel, the engine's choice for this machine)
    for n in 1 4 auto; do
        flag=$([ "$n" = auto ] || echo "--parallel $n")
        step "parallel_8b_$n" bash -c "rm -rf /tmp/p8b; sync; TIMEFORMAT='%R s wall'; time $PY -m modelinit.cli init \
            llama-3-8b --dtype bfloat16 --device cuda $flag --max-shard-size 2GB --quiet --out /tmp/p8b; rm -rf /tmp/p8b"
    done
    ;;
*)
    echo "usage: $0 tests|bench|floor" >&2
    exit 2
    ;;
esac
