#!/usr/bin/env bash
# Sourced by the device_*.sh scripts on the GPU machine: build (or load) bytesplat's CUDA extension once and copy
# the .so to $OUT when this call built it, so a later call can carry it back (put it in .build-cache/ext/ and carry
# .build-cache); one loaded from the carried cache is not sent back ($OUT holds 8 files).
# Makes $OUT (default /tmp/device-out) and writes the GPUs there (gpu.txt, also shown) and $OUT/build.log. Defines
# run_gpu_tests for the scripts that source it.
OUT=${OUT:-/tmp/device-out}
mkdir -p "$OUT"
nvidia-smi -L | tee "$OUT/gpu.txt"
export MAX_JOBS=12 TORCH_CUDA_ARCH_LIST=9.0 PYTHONUNBUFFERED=1
export BYTESPLAT_EXT_DIR=${BYTESPLAT_EXT_DIR:-$PWD/.build-cache/ext}
build_start=$(date +%s)
python3 - > "$OUT/build.log" 2>&1 <<'PY'
import time

from bytesplat_ns.cuda import build, ops
import torch

t = time.time()
carried = build.prebuilt_path(build.module_name()) is not None
build.load()
print(f"{build.module_name()} ready in {time.time() - t:.1f} s (prebuilt: {build.prebuilt_path(build.module_name())})")
print("loaded from the carried cache" if carried else "built in this call")
cuda = torch.device("cuda")
for side in (ops.TILE_SIZE, ops.SMALL_TILE_SIZE):
    print(f"on-chip capacity, {side}-pixel tiles: rgb", ops.tile_capacity(cuda, 3, side), "rgb+depth",
          ops.tile_capacity(cuda, 4, side))
PY
tail -3 "$OUT/build.log"
so=$(python3 -c "from bytesplat_ns.cuda import build; print(build.prebuilt_path(build.module_name()) or '')")
if [ -n "$so" ] && grep -q "built in this call" "$OUT/build.log"; then
  cp "$so" "$OUT/" && echo "built module: $(basename "$so") (carry it back via BYTESPLAT_EXT_DIR)"
fi
echo "build: $(( $(date +%s) - build_start )) s"

# run_gpu_tests DEFAULT: pytest on $GPU_TESTS (DEFAULT when it is unset; GPU_TESTS="" runs none) into $OUT/pytest.log,
# one line per test as it ends; its summary shown. GPU_TESTS_TIMEOUT (seconds) interrupts pytest as Ctrl-C would, so
# the failures so far are still reported and the rest of the call still runs.
run_gpu_tests() {
  local tests=${GPU_TESTS-$1}
  [ -n "$tests" ] || return 0
  timeout -s INT "${GPU_TESTS_TIMEOUT:-100000}" python3 -m pytest -p no:cacheprovider -v -rfEs --durations=10 $tests \
    > "$OUT/pytest.log" 2>&1
  echo "pytest rc $?"
  grep -E "^(FAILED|ERROR)|passed|failed|KeyboardInterrupt" "$OUT/pytest.log" | tail -12
}
