#!/usr/bin/env bash
# The checks of a GPU machine, in one run of a fixed length: the CUDA benchmarks first, on a quiet
# machine (the hash against x.sum(), the GPT-style transformer's whole-process recording overhead),
# then the CUDA tests beside the rest of the suite.
#
#   bash benchmarks/gpu_check.sh OUT [SECONDS]    # OUT: logs, JUnit files; OUT/bench: as benchmarks/results-cuda
#   STAGES="cuda gpt" CUDA_SHARE=58 bash benchmarks/gpu_check.sh OUT 540   # some stages, in this order
#
# Stages: hash (the hash against x.sum(), many small tensors), gpt (the transformer's overhead,
# a recipe's loop), script (benchmarks/gpt_script.py recorded unchanged: whole-process overhead),
# cuda (the CUDA tests alone), cli (the CUDA tests beside compare and doctor on the GPT script),
# tests (the CUDA tests beside the rest of the suite). A stage's SHARE is a percentage of the
# seconds left when it starts; CUDA_TESTS_ARGS are added to the CUDA tests' pytest command.
# Assumes bisect-repro installed (pip install -e ".[test]") with pytest-xdist. Each stage has its
# own share of SECONDS (default 570) and is interrupted with SIGINT at its end, so that pytest still
# writes its summary and JUnit file; a stage cut short says so in OUT/stages.txt. It writes
# stages.txt, cuda.log, cuda.xml, suite.log, suite.xml, bench.log, script.log, cli.log,
# bench/results.{json,md}, bench/script_cost.json.
set -u
out=${1:?usage: gpu_check.sh OUT [SECONDS]}
budget=${2:-570}
mkdir -p "$out/bench"
t0=$SECONDS
stage() {  # stage NAME LOG SECONDS COMMAND...: run COMMAND, its output added to OUT/LOG.log
  local name=$1 log=$2 limit=$3 start=$SECONDS rc
  shift 3
  timeout -s INT -k 15 "$limit" "$@" >>"$out/$log.log" 2>&1
  rc=$?
  echo "$name: rc=$rc in $((SECONDS - start)) s (limit $limit s)" >>"$out/stages.txt"
}
share() { echo $(((budget - (SECONDS - t0)) * $1 / 100)); }

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv >>"$out/stages.txt" 2>&1
python3 -c 'import torch, bisect_repro; print(torch.__version__, torch.cuda.get_device_name())' >>"$out/stages.txt" 2>&1

cuda_tests() {  # cuda_tests SECONDS WORKERS: the CUDA tests, each verdict they print kept in the log
  # shellcheck disable=SC2086  # CUDA_TESTS_ARGS: words for pytest
  stage cuda cuda "$1" python3 -m pytest -m cuda -q -rfEP -n "$2" -p no:cacheprovider --durations 30 \
    --junitxml "$out/cuda.xml" ${CUDA_TESTS_ARGS:-}
}
script_cost() {  # script_cost NAME SECONDS PARTS...: benchmarks/script_cost.py on the GPT script
  # shellcheck disable=SC2086  # SCRIPT_ARGS: words (--quick for a CPU check)
  local name=$1 limit=$2
  shift 2
  stage "$name" "$name" "$limit" python3 -m benchmarks.script_cost --case gpt --out "$out/bench" --rounds "${SCRIPT_ROUNDS:-2}" ${SCRIPT_ARGS:-} --only "$@"
}
for name in ${STAGES:-hash gpt tests}; do
  case $name in
    hash) stage hash bench 45 python3 -m benchmarks.run --device cuda --out "$out/bench" --only hash small ;;
    gpt) stage gpt bench "$(share "${GPT_SHARE:-45}")" python3 -m benchmarks.run --device cuda --out "$out/bench" --only gpt --runs "${GPT_RUNS:-2}" ;;
    script) script_cost script "$(share "${SCRIPT_SHARE:-40}")" overhead ;;
    cuda) cuda_tests "$(share "${CUDA_SHARE:-97}")" 8 ;;
    cli)
      both=$(share 97)
      cuda_tests "$both" 8 &
      script_cost cli "$both" compare doctor &
      wait
      ;;
    tests)
      suite=$(share 97)
      cuda_tests "$suite" 6 &
      stage suite suite "$suite" python3 -m pytest -m "not cuda" -q -rfE -n 10 -p no:cacheprovider --durations 15 --junitxml "$out/suite.xml" &
      wait
      ;;
    *) echo "unknown stage: $name" >>"$out/stages.txt" ;;
  esac
done
echo "whole: $((SECONDS - t0)) s" >>"$out/stages.txt"
